"""The tool_use analysis' measures of the calls: its pieces on calls written by hand, and its numbers over a real run
of a user's tool env (scripted random calls: right, wrong, unknown, malformed), against a count made here from the
replies' own text with a regular expression, not through the analysis' JSON or SQL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ragen_core.config import load_config
from ragen_core.findings.analysis import Arm, Context
from ragen_core.findings.tool_use import (
    COPIED,
    TEACHER_CALL,
    TEACHER_SHAPE,
    TEACHER_TOOL,
    call_measures,
    first_call_match,
    literals_copied,
    shape,
)
from ragen_core.storage import DataLake, query
from ragen_core.tools import ToolCall

SAY = '''
import numpy as np

from ragen_core.envs import ToolEnv, tool
from ragen_core.tools import ToolCall, ToolResult

WORDS = ["Abel", "Bora", "Cato", "Dune", "Elm", "Fenn"]


class Say(ToolEnv):
    """Say the word the question names, with say(word), in one call."""

    def reset(self, seed):
        self.word, self.said = WORDS[seed % len(WORDS)], None
        return self.render(), {"success": False}

    def render(self):
        return f"Please say {self.word} now."

    def instruction(self):
        return "Call say with the word."

    @property
    def success(self):
        return self.said == self.word

    def reward_bounds(self, max_actions):
        return 0.0, 1.0

    @tool
    def say(self, word: str) -> ToolResult:
        """Say a word; this ends the episode."""
        self.said = word
        return ToolResult("heard", float(self.success), done=True)

    def teacher_actions(self, actions_left):
        return [ToolCall("say", {"word": self.word}).text()]

    def sample_action(self, rng):
        other = WORDS[(WORDS.index(self.word) + 1) % len(WORDS)]
        calls = [
            ToolCall("say", {"word": self.word}).text(),
            ToolCall("say", {"word": other}).text(),
            ToolCall("shout", {"word": self.word}).text(),
            ToolCall("say", {"words": 3}).text(),
        ]
        return calls[int(rng.integers(len(calls)))]
'''


def test_the_first_call_is_matched_against_the_teacher_s_exactly_by_tool_and_by_shape():
    teacher = ToolCall("calculate", {"expression": "4821 - 376"})
    assert first_call_match("calculate", '{"expression": "4821 - 376"}', teacher) == (True, True, True)
    assert first_call_match("calculate", '{"expression": "2638 - 823"}', teacher) == (False, True, True)
    assert first_call_match("calculate", '{"expression": "2638 * 823"}', teacher) == (False, True, False)
    assert first_call_match("calculate", '{"expression": "4821 - 376"', teacher) == (False, True, False)  # not JSON
    assert first_call_match("answer", '{"expression": "4821 - 376"}', teacher) == (False, False, False)
    assert first_call_match(None, None, teacher) == (False, False, False)  # the reply called nothing


def test_a_shape_masks_quoted_strings_digit_runs_and_capitalised_words_only():
    sql = "SELECT name FROM staff WHERE team = 'Kiquon' ORDER BY salary DESC LIMIT 1"
    assert shape({"sql": sql}) == {"sql": "SELECT name FROM staff WHERE team = '?' ORDER BY salary DESC LIMIT #"}
    assert shape({"query": "Tor Quenby", "k": 3}) == {"query": "# #", "k": "#"}
    assert shape([True, None, "joined >= 2009"]) == [True, None, "joined >= #"]


def test_literals_copied_counts_the_call_s_literals_found_in_the_observation_as_whole_words():
    question = "A farm has 4821 apples. It sells 376 apples. Where was Tor born?"
    assert literals_copied('{"expression": "4821 - 376"}', question) == (2, 2)
    assert literals_copied('{"expression": "482 - 3760"}', question) == (0, 2)  # parts of a number are not it
    assert literals_copied('{"query": "Tor Quenby"}', question) == (1, 2)
    assert literals_copied(None, question) == (0, 0)


CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
# What each of the scripted policy's four calls is, by hand: (exact, right tool, right shape, malformed, literals
# in its arguments, of those copied from the question)
KINDS = {
    "right": (True, True, True, False, 1, 1),
    "other word": (False, True, True, False, 1, 0),
    "shout": (False, False, False, True, 1, 1),
    "words": (False, True, False, True, 1, 0),
}


def _kind(text: str, word: str) -> str:
    """Which of the four calls a reply's JSON is: its text compared whole with each, as the policy writes them."""
    if text == f'{{"name": "say", "arguments": {{"word": "{word}"}}}}':
        return "right"
    if text == f'{{"name": "shout", "arguments": {{"word": "{word}"}}}}':
        return "shout"
    if text == '{"name": "say", "arguments": {"words": 3}}':
        return "words"
    assert re.fullmatch(r'\{"name": "say", "arguments": \{"word": "[A-Z][a-z]+"\}\}', text), text
    return "other word"


def _by_hand(root: Path, run: str) -> dict[int, dict[str, float]]:
    """Per validation iteration, the measures counted from the replies' text (one call each) and :data:`KINDS`;
    the word asked for is the one after "Please say" in the observation."""
    rows = query(
        root,
        "SELECT iteration, group_id, traj_index, turn_index, observation, response FROM turns "
        "WHERE run_id = $run AND split = 'val' ORDER BY ALL",
        params={"run": run},
    ).to_pylist()
    out: dict[int, dict] = {}
    words = {}  # per episode, the word its first observation asks for (later ones are the tools' feedback)
    for row in rows:
        episode = (row["iteration"], row["group_id"], row["traj_index"])
        if row["turn_index"] == 0:
            words[episode] = row["observation"].split("Please say ")[1].split()[0]
        counts = out.setdefault(row["iteration"], {"episodes": set(), "kinds": [], "firsts": []})
        counts["episodes"].add(episode)
        (text,) = CALL.findall(row["response"])
        kind = KINDS[_kind(text, words[episode])]
        counts["kinds"].append(kind)
        if row["turn_index"] == 0:
            counts["firsts"].append(kind)
    measures = {}
    for iteration, c in out.items():
        firsts = c["firsts"]
        measures[iteration] = {
            "calls_per_episode": len(c["kinds"]) / len(c["episodes"]),
            "malformed_share": sum(k[3] for k in c["kinds"]) / len(c["kinds"]),
            TEACHER_CALL: sum(k[0] for k in firsts) / len(firsts),
            TEACHER_TOOL: sum(k[1] for k in firsts) / len(firsts),
            TEACHER_SHAPE: sum(k[2] for k in firsts) / len(firsts),
            COPIED: sum(k[5] for k in firsts) / sum(k[4] for k in firsts),
        }
    return measures


@pytest.fixture(scope="module")
def say_run(tmp_path_factory, tiny_model_dir):
    import ragen_core

    user, root = tmp_path_factory.mktemp("user"), tmp_path_factory.mktemp("say")
    (user / "say_tools.py").write_text(SAY)
    overrides = [
        f"model.path={tiny_model_dir}",
        "env.name=say_tools:Say",
        "env.val_envs=[say_tools:Say]",
        "env.options={}",
        "rollout.backend=scripted",
        "rollout.scripted_policy=random",
        "rollout.env_groups=2",
        "rollout.group_size=2",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=4",
        "trainer.iterations=1",
        "eval.every=1",
        "eval.instances=16",
        "bootstrap.enabled=false",
        "bootstrap.policy=random",
        "trainer.num_threads=1",
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(user))
        assert ragen_core.train("configs/calculator.yaml", root, "say", overrides).status == "completed"
        config = load_config("configs/calculator.yaml", overrides)
        arm = Arm("say", "say", [], ["say"], config)
        measured = call_measures(Context(DataLake(root), [arm], None, {}, "say_tools:Say", {}), arm, "say_tools:Say")
    return root, measured


def test_the_calls_measures_equal_a_count_from_the_replies_text(say_run):
    root, measured = say_run
    by_hand = _by_hand(root, "say")
    assert sorted(measured["say"]) == sorted(by_hand) == [0, 1]
    for iteration, expected in by_hand.items():
        got = measured["say"][iteration]
        assert got["truncated_share"] == 0.0  # scripted replies always end
        for key, value in expected.items():
            assert got[key] == pytest.approx(value), (iteration, key)
        assert 0 < got["malformed_share"] < 1 and 0 < got[TEACHER_CALL] < got[TEACHER_TOOL] < 1  # every kind drawn
