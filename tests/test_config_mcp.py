"""``env.mcp``: a server's command (a list of strings) or null, out of the config hash at null, a program that a
stored config names only when named again (docs/security.md), and a server the run's check starts before anything
else, for a tool env played in this process only."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
import yaml

from ragen_core.config import ConfigError, RunConfig, build_config, parse_override
from ragen_core.config.trust import StoredConfig, UntrustedConfigError, check_stored_trust, trusted_keys
from ragen_core.envs.mcp_tools import close_mcp_servers
from ragen_core.run.checks import build_run_config, check_run_start

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SERVER = Path(__file__).resolve().parent / "envs" / "mcp_calculator_server.py"

# RunConfig().config_hash() and each shipped config's, measured at commit f0953e4 (before env.mcp existed)
HASHES_BEFORE = {
    None: "fc667e9a199578de",
    "bandit.yaml": "a0dc12c2f535fee6",
    "frozenlake.yaml": "80f1ad5dad44588c",
    "sokoban.yaml": "3504e01c6837948c",
    "countdown.yaml": "dbd6af15e6d41def",
}


@pytest.mark.parametrize("shipped", list(HASHES_BEFORE))
def test_null_is_the_default_and_leaves_every_config_hash_as_it_was(shipped):
    tree = None if shipped is None else yaml.safe_load((CONFIGS / shipped).read_text())
    config = build_config(tree)
    assert config.env.mcp is None and config.to_dict()["env"]["mcp"] is None
    assert config.config_hash() == HASHES_BEFORE[shipped]
    served = build_config(tree, ["env.mcp={command: [python, server.py]}"])
    assert served.config_hash() != HASHES_BEFORE[shipped]  # whose tools the agent called is part of what a run was


def test_the_key_is_recorded_as_given():
    given = "env.mcp={command: [python, s.py, --x], env: {MODE: fast}, pass_env: [TOKEN], cwd: /srv}"
    config = build_config(None, [given])
    assert config.to_dict()["env"]["mcp"] == {
        "command": ["python", "s.py", "--x"],
        "env": {"MODE": "fast"},
        "pass_env": ["TOKEN"],  # a name: the value is read from the run's environment when the server starts
        "cwd": "/srv",
    }
    bare = build_config(None, ["env.mcp={command: [my-server]}"])
    assert bare.to_dict()["env"]["mcp"] == {"command": ["my-server"], "env": {}, "pass_env": [], "cwd": None}


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("{command: python server.py}", "env.mcp.command: is a list of strings, the program and its arguments"),
        ("{command: []}", "env.mcp.command: List should have at least 1 item"),
        ('{command: [" "]}', "env.mcp.command: starts with the program to run, not an empty text"),
        ("{command: [python, 3]}", "env.mcp.command.1: Input should be a valid string"),
        ("{env: {A: b}}", "env.mcp.command: required"),
        ("{command: [x], args: [y]}", "env.mcp.args: unknown key"),
        ("{command: [x], env: {A: [1]}}", "env.mcp.env.A: Input should be a valid string"),
        ("{command: [x], pass_env: [API-TOKEN]}", "env.mcp.pass_env: 'API-TOKEN' is no environment variable's name"),
        ("{command: [x], pass_env: TOKEN}", "env.mcp.pass_env: Input should be a valid list"),
        ("{command: [x], env: {T: v}, pass_env: [T]}", "env.mcp: T is in both env and pass_env: set one of them"),
        ("[python, server.py]", "env.mcp: Input should be a valid dictionary"),
    ],
)
def test_a_wrong_key_is_refused_naming_it(given, said):
    with pytest.raises(ConfigError) as caught:
        build_config(None, [f"env.mcp={given}"])
    assert said in str(caught.value)


def test_a_stored_config_starts_its_server_only_when_named_again(tmp_path):
    declared = {key.key: key.kind for key in trusted_keys(RunConfig)}
    assert declared["env.mcp"] == "program"
    config = build_config(None, ["env.mcp={command: [python, /tmp/x.py]}"])
    stored = StoredConfig(config.to_dict(), "runs/r/manifest.json", tmp_path)
    with pytest.raises(UntrustedConfigError) as caught:
        check_stored_trust(config, stored, set())
    message = str(caught.value)
    again = 'env.mcp={"command":["python","/tmp/x.py"],"env":{},"pass_env":[],"cwd":null}'
    assert message.endswith(f"does not name a program to run: pass {shlex.quote(again)} again to use it")
    path, value = parse_override(again)  # what the message says to pass is the stored value
    assert build_config(None, [again]).env.mcp == config.env.mcp and path == ["env", "mcp"] and value["cwd"] is None
    check_stored_trust(config, stored, {"env.mcp"})  # named again
    check_stored_trust(build_config(), StoredConfig(build_config().to_dict(), "m", tmp_path), set())  # null


def _last_line(overrides: list[str]) -> str:
    """The last line of the refusal when a run starts (loading the config starts no server: test_config_remote)."""
    with pytest.raises(ConfigError) as caught:
        check_run_start(build_run_config(None, overrides))
    return str(caught.value).splitlines()[-1].strip()


def test_the_run_s_check_wants_a_tool_env_played_here():
    server = f"env.mcp={{command: [{sys.executable}, {SERVER}]}}"
    assert _last_line(["env.name=bandit", server]) == (
        "env.mcp gives its tools to a tool env's agent, and bandit acts by no tool calls (calculator does; "
        "docs/environments.md, 'Tool environments')"
    )
    with pytest.raises(ConfigError) as caught:  # refused as the config loads: no server asked, none started
        build_config(None, ["env.name=calculator", "env.remote=http://127.0.0.1:9", server])
    assert str(caught.value).splitlines()[-1].strip() == (
        "env: env.mcp gives tools to a tool env played in this process, and env.remote plays env.name on a server: "
        "set one of them"
    )


def test_the_run_s_check_starts_the_server_and_one_that_cannot_start_is_one_line():
    missing = _last_line(["env.name=calculator", "env.mcp={command: [ragen-no-such-mcp-server]}"])
    assert missing == (
        "the MCP server `ragen-no-such-mcp-server` (env.mcp) could not start: FileNotFoundError: [Errno 2] No such "
        "file or directory: 'ragen-no-such-mcp-server'"
    )
    config = check_run_start(
        build_run_config(None, ["env.name=calculator", f"env.mcp={{command: [{sys.executable}, {SERVER}]}}"])
    )
    assert config.env.mcp.command == [sys.executable, str(SERVER)]
    close_mcp_servers()


def test_a_pass_env_name_not_set_is_one_line_when_the_run_starts(monkeypatch):
    monkeypatch.delenv("RAGEN_NO_SUCH_MCP_TOKEN", raising=False)
    server = f"env.mcp={{command: [{sys.executable}, {SERVER}], pass_env: [RAGEN_NO_SUCH_MCP_TOKEN]}}"
    assert _last_line(["env.name=calculator", server]) == (
        f"the MCP server `{sys.executable} {SERVER}` (env.mcp) could not start: env.mcp.pass_env names "
        "RAGEN_NO_SUCH_MCP_TOKEN, not set in this process's environment"
    )
