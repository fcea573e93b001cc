"""The tool keys of the config: out of the hash at their defaults (every stored run and finding keeps its hash), in
it otherwise; an unknown parser and a windowed chat for a tool env refused in one line, before anything runs."""

from __future__ import annotations

import pytest

from ragen_core.config import ConfigError, build_config
from ragen_core.config.tree import LATER_KEYS
from ragen_core.run.checks import build_run_config


def test_the_tool_keys_are_later_keys_out_of_the_hash_at_their_defaults():
    default = build_config()
    assert (default.env.tool_timeout_s, default.rollout.tool_parser) == (10.0, "hermes")
    assert LATER_KEYS["env.tool_timeout_s"] == 10.0 and LATER_KEYS["rollout.tool_parser"] == "hermes"
    tree = default.to_dict()
    assert "tool_timeout_s" in tree["env"] and "tool_parser" in tree["rollout"]
    assert build_config(overrides=["env.tool_timeout_s=10"]).config_hash() == default.config_hash()
    assert build_config(overrides=["env.tool_timeout_s=2"]).config_hash() != default.config_hash()
    assert build_config(overrides=["rollout.tool_parser=llama3_json"]).config_hash() != default.config_hash()
    assert build_config(overrides=["env.tool_timeout_s=null"]).env.tool_timeout_s is None
    with pytest.raises(ConfigError, match="env.tool_timeout_s"):
        build_config(overrides=["env.tool_timeout_s=0"])


def test_an_unknown_parser_is_refused_listing_the_registered_ones():
    with pytest.raises(ConfigError) as caught:
        build_run_config(overrides=["rollout.tool_parser=mistral"])
    assert "rollout.tool_parser: unknown tool-call parser 'mistral'; registered: hermes, llama3_json" in str(
        caught.value
    )


def test_a_tool_env_is_played_with_its_whole_chat():
    with pytest.raises(ConfigError) as caught:
        build_run_config(
            overrides=[
                "env.name=calculator",
                "rollout.context_window_mode=single_turn",
                "rollout.max_context_window=1",
            ]
        )
    assert "calculator is a tool env, played with its whole chat" in str(caught.value)
    build_run_config(
        overrides=["env.name=frozen_lake", "rollout.context_window_mode=single_turn", "rollout.max_context_window=1"]
    )


def test_a_tool_env_whose_tools_no_schema_can_state_is_refused_before_anything_runs(tmp_path, monkeypatch):
    (tmp_path / "untyped_tools.py").write_text(
        "from ragen_core.envs import ToolEnv, tool\n\n\n"
        "class Untyped(ToolEnv):\n"
        "    def reset(self, seed):\n"
        '        return "here", {"success": False}\n\n'
        "    def render(self):\n"
        '        return "here"\n\n'
        "    def instruction(self):\n"
        '        return "Look."\n\n'
        "    success = False\n\n"
        "    def reward_bounds(self, max_actions):\n"
        "        return 0.0, 1.0\n\n"
        "    @tool\n"
        "    def look(self, where):\n"
        '        """Look somewhere."""\n'
        "        return where\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        build_run_config(overrides=["env.name=untyped_tools:Untyped", "env.val_envs=[untyped_tools:Untyped]"])
    (line,) = [line for line in str(caught.value).splitlines() if "look" in line]
    assert "tool look: parameter 'where' has no type hint; annotate it" in line
