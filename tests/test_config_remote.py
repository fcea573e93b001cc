"""``env.remote``: a server URL or null, out of the config hash at null, a host that a stored config names only on
this machine's loopback (docs/security.md), and a server asked when a run starts (before any compute), never when a
config is only loaded or shown."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from ragen_core.config import ConfigError, RunConfig, build_config
from ragen_core.config.trust import StoredConfig, UntrustedConfigError, check_stored_trust, trusted_keys
from ragen_core.run.checks import build_run_config, check_run_start

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


# RunConfig().config_hash() and each shipped config's, measured at commit f0953e4 (before env.remote existed)
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
    assert config.env.remote is None and config.env.remote_for(config.env.name) is None
    assert config.config_hash() == HASHES_BEFORE[shipped]
    remote = build_config(tree, ["env.remote=http://127.0.0.1:8000"])
    assert remote.config_hash() != HASHES_BEFORE[shipped]  # where the env ran is part of what a run was


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("https://envs.example:443", "https://envs.example:443"),
        ("http://[::1]:9000", "http://[::1]:9000"),
    ],
)
def test_a_server_url_is_kept_without_its_trailing_slash(given, kept):
    config = build_config(None, [f"env.remote={given}"])
    assert config.env.remote == kept
    assert config.env.remote_for(config.env.name) == kept and config.env.remote_for("bandit_test") is None


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("127.0.0.1:8000", "a scheme other than http or https"),
        ("ftp://127.0.0.1:8000", "a scheme other than http or https"),
        ("http://127.0.0.1:8000/envs", "a path"),
        ("http://user:secret@127.0.0.1:8000", "credentials"),
        ("http://127.0.0.1:8000?x=1", "a query or fragment"),
        ("http://127.0.0.1:0", "port 0"),
        ("http://127.0.0.1:99999", "is not a URL"),
    ],
)
def test_anything_but_a_server_url_is_refused_in_one_line(given, said):
    with pytest.raises(ConfigError) as caught:
        build_config(None, [f"env.remote={given}"])
    message = str(caught.value)
    assert "env.remote" in message and said in message


def _stored(remote: str, tmp_path) -> None:
    config = build_config(None, [f"env.remote={remote}"])
    stored = StoredConfig(config.to_dict(), "runs/r/manifest.json", tmp_path)
    check_stored_trust(config, stored, set())


def test_a_stored_config_reaches_only_this_machine_s_loopback_unless_named_again(tmp_path):
    declared = {key.key: key.kind for key in trusted_keys(RunConfig)}
    assert declared["env.remote"] == "host"
    for loopback in ("http://127.0.0.1:8000", "http://127.0.0.2:8000", "http://localhost:8000", "http://[::1]:8000"):
        _stored(loopback, tmp_path)  # harmless: nothing leaves the machine
    for elsewhere in ("http://10.0.0.7:8000", "http://envs.example:8000", "http://0.0.0.0:8000"):
        with pytest.raises(UntrustedConfigError) as caught:
            _stored(elsewhere, tmp_path)
        assert str(caught.value) == (
            f"runs/r/manifest.json sets env.remote='{elsewhere}'; a config stored in the data root does not name a "
            f"host other than this machine's loopback to connect to: pass env.remote={elsewhere} again to use it"
        )
    config = build_config(None, ["env.remote=http://10.0.0.7:8000"])
    check_stored_trust(config, StoredConfig(config.to_dict(), "m", tmp_path), {"env.remote"})  # named again


def _dead_port() -> int:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_loading_a_config_asks_no_server_the_run_s_start_does_and_a_missing_one_is_one_line():
    url = f"http://127.0.0.1:{_dead_port()}"
    config = build_run_config(None, [f"env.remote={url}", "rollout.scripted_policy=teacher_mix"])  # nothing asked
    assert config.env.remote == url
    with pytest.raises(ConfigError) as caught:
        check_run_start(config)
    line = str(caught.value).splitlines()[-1].strip()
    assert line.startswith(f"env.remote: the env server {url} is unreachable on GET /ragen/env")


def test_config_show_asks_no_server_and_train_fails_in_one_line_before_any_compute(tmp_path):
    """``ragen config show`` with a server that is down shows the config; ``ragen train`` with it stops in one line
    before anything is made (not even the data root)."""
    from typer.testing import CliRunner

    from ragen_cli.main import app

    remote = f"env.remote=http://127.0.0.1:{_dead_port()}"
    shown = CliRunner().invoke(app, ["config", "show", "--config", "configs/frozenlake.yaml", remote, "-f", "json"])
    assert shown.exit_code == 0, shown.output
    assert {"key": "env.remote", "value": remote.split("=", 1)[1]}.items() <= next(
        row for row in json.loads(shown.stdout) if row["key"] == "env.remote"
    ).items()
    root = tmp_path / "root"
    trained = CliRunner().invoke(
        app, ["train", "--config", "configs/frozenlake.yaml", "--data-root", str(root), remote]
    )
    lines = trained.stderr.strip().splitlines()
    assert trained.exit_code == 2 and len(lines) == 1, trained.output
    assert lines[0].startswith("error: ") and "is unreachable on GET /ragen/env" in lines[0]
    assert not root.exists()


@pytest.mark.process
def test_the_check_asks_the_server_each_time_not_what_the_process_heard_before(tmp_path):
    from tests.envs.env_servers import serve, stop

    process, url = serve("bandit", tmp_path / "bandit.log")
    try:
        assert check_run_start(build_run_config(None, [f"env.remote={url}"])).env.remote == url
    finally:
        stop(process)
    config = build_run_config(None, [f"env.remote={url}"])  # the same process, the server gone: loads, asks nothing
    with pytest.raises(ConfigError) as caught:  # asked again when the run starts: refused
        check_run_start(config)
    assert f"env.remote: the env server {url} is unreachable on GET /ragen/env" in str(caught.value)
