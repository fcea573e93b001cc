"""docs/environments.md's tool env example runs as written: its tools' schemas, and a rollout that looks a word up
and answers, by its import path (as `env.name=module:Class`)."""

from __future__ import annotations

import re
from pathlib import Path

from ragen_core.agent import ChatFormatter
from ragen_core.envs import make_env
from ragen_core.rollout import RolloutSpec, run_rollouts
from ragen_core.rollout.types import Generation
from ragen_core.tools import ToolCall

DOC = Path(__file__).resolve().parents[2] / "docs" / "environments.md"


def _example() -> str:
    section = DOC.read_text().split("## Tool environments", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


class Replies:
    """Writes the same calls for every trajectory, turn by turn, as a model of the hermes format would."""

    behavior_source = "scripted"

    def __init__(self, tokenizer, calls):
        self.tokenizer, self.calls, self.turn = tokenizer, calls, -1

    def generate(self, contexts, seed):
        self.turn += 1
        text = f"<tool_call>\n{self.calls[self.turn].text()}\n</tool_call>"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [Generation(ids, None, text, False) for _ in contexts]


def test_the_documented_tool_env_runs_as_written(tmp_path, monkeypatch, tiny_policy):
    (tmp_path / "riddle_example.py").write_text(_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_env("riddle_example:Riddle")
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["answer", "lookup"]
    assert env.tool_schemas()[1]["function"]["parameters"]["properties"]["word"] == {
        "type": "string",
        "description": "one English word",
    }
    calls = [ToolCall("lookup", {"word": "echo"}), ToolCall("answer", {"word": "echo"})]
    spec = RolloutSpec("riddle_example:Riddle", [0], 1, 3, 1, 3, enable_think=False)
    (record,) = run_rollouts(spec, Replies(tiny_policy[1], calls), ChatFormatter(tiny_policy[1]), seed=0)
    assert record.success and record.env_reward == 1.0 and len(record.turns) == 2
    assert record.turns[1].observation == "a sound sent back"


def test_the_calculator_of_the_verl_and_trl_comparison_runs_as_written(tmp_path, monkeypatch, tiny_policy):
    section = DOC.read_text().split("### Coming from verl or TRL", 1)[1].split("\n### ", 1)[0]
    (tmp_path / "calc_example.py").write_text(re.search(r"```python\n(.*?)```", section, re.S).group(1))
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_env("calc_example:Calc")
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["calculate", "answer"]
    # seed 4: "What is 4 * 37 + 1?", 149 by hand
    calls = [ToolCall("calculate", {"expression": "4 * 37 + 1"}), ToolCall("answer", {"value": 149})]
    spec = RolloutSpec("calc_example:Calc", [4], 1, 3, 1, 3, enable_think=False)
    (record,) = run_rollouts(spec, Replies(tiny_policy[1], calls), ChatFormatter(tiny_policy[1]), seed=0)
    assert record.success and record.env_reward == 1.0 and record.turns[1].observation == "149"
    assert [t.tool_calls[0]["result"] for t in record.turns] == ["149", "right"]
