"""Tool envs rolled out: token-exact (the ids the update trains on are the ids the sampler saw, and they spell the
chat the template renders), the loss mask on the replies only, and every way a call can go wrong told to the agent
and kept as data, never a crash."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ragen_core.agent import ChatFormatter, TemplateError
from ragen_core.envs import ToolEnv, make_env, tool
from ragen_core.envs.external import UserCodeError
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.rollout.records import BatchMeta, trajectories_table, turns_table
from ragen_core.tools import ToolCall
from ragen_core.update.rows import TokenRows
from tests.agent.test_tool_chat import thinking_dropped


class Recorder:
    """Wraps a backend and keeps, per call, the prompt ids each context showed and the reply it got back."""

    def __init__(self, backend):
        self.backend, self.behavior_source, self.seen = backend, backend.behavior_source, []

    def generate(self, contexts, seed):
        generations = self.backend.generate(contexts, seed)
        self.seen.append([(list(c.prompt_ids), g) for c, g in zip(contexts, generations, strict=True)])
        return generations

    def reset(self):
        getattr(self.backend, "reset", lambda: None)()


def _spec(**overrides):
    settings = {"max_turns": 4, "max_actions_per_turn": 1, "max_actions_per_traj": 4, "enable_think": False}
    return RolloutSpec("calculator", [3, 4], 2, **{**settings, **overrides})


def test_the_ids_the_update_trains_on_are_the_ids_the_sampler_saw(tiny_policy):
    model, tokenizer = tiny_policy
    recorder = Recorder(HFBackend(model, tokenizer, 1.0, 24))
    spec = _spec(max_turns=3)
    records = run_rollouts(spec, recorder, ChatFormatter(tokenizer, style="compact"), seed=5)
    rows = TokenRows.from_table(trajectories_table(records, BatchMeta.training("r", 0, 1.0, "h")), logprobs=True)
    for index, (record, ids, mask) in enumerate(zip(records, rows.id_rows(), rows.mask_rows(), strict=True)):
        # the sampler's prompts and replies of this trajectory, turn by turn, rebuilt without the engine
        rebuilt, trained, logprobs = [], [], []
        for turn in recorder.seen[: len(record.turns)]:
            prompt, generation = turn[index]
            assert prompt[: len(rebuilt)] == rebuilt  # every prompt continues the sequence so far
            context = prompt[len(rebuilt) :]
            rebuilt += context + generation.token_ids
            trained += [0] * len(context) + [1] * len(generation.token_ids)
            logprobs += [0.0] * len(context) + generation.logprobs
        assert ids.tolist() == rebuilt == record.input_ids
        assert mask.tolist() == trained and record.behavior_logprobs == logprobs


def test_the_sequence_spells_the_chat_the_template_renders(tiny_policy):
    tokenizer = tiny_policy[1]
    formatter = ChatFormatter(tokenizer)  # the full style: a system message before the tools
    records = run_rollouts(_spec(), ScriptedBackend("expert", tokenizer), formatter, seed=0)
    for record in records:
        assert record.success and [t.tool_calls[0]["name"] for t in record.turns] == [
            "calculate",
            "calculate",
            "answer",
        ]
        env = make_env("calculator")
        question, _ = env.reset(record.env_seed)
        chat = [
            {"role": "system", "content": formatter.system_prompt},
            {"role": "user", "content": f"{env.instruction()}\n{question}"},
        ]
        for turn in record.turns:
            chat.append({"role": "assistant", "content": turn.response})
            chat += [{"role": "tool", "content": call["result"]} for call in turn.tool_calls]
        rendered = tokenizer.apply_chat_template(chat[:-1], tools=env.tool_schemas(), tokenize=False)
        assert tokenizer.decode(record.input_ids) + "\n" == rendered  # the last reply ends with its stop token
        # trained: the replies' tokens exactly (their text and stop token); the system message, the tools and the
        # tool results are context
        trained = [t for t, m in zip(record.input_ids, record.loss_mask, strict=True) if m]
        replies = [
            tokenizer.encode(t.response, add_special_tokens=False) + [tokenizer.eos_token_id] for t in record.turns
        ]
        assert trained == [t for reply in replies for t in reply]
        context = tokenizer.decode([t for t, m in zip(record.input_ids, record.loss_mask, strict=True) if not m])
        assert (
            "<tools>" in context and "<tool_response>" in context and "calculate(" not in context.split("<tools>")[0]
        )


def _scripted(replies):
    """A backend writing ``replies`` (raw text, by turn) for every trajectory, tokenised as a model's would be."""

    class Backend:
        behavior_source = "scripted"

        def __init__(self, tokenizer):
            self.tokenizer, self.turn = tokenizer, -1

        def generate(self, contexts, seed):
            from ragen_core.rollout.types import Generation

            self.turn += 1
            text = replies[min(self.turn, len(replies) - 1)]
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            return [Generation(ids, None, text, False) for _ in contexts]

    return Backend


def _call(name, **arguments):
    return f"<tool_call>\n{ToolCall(name, arguments).text()}\n</tool_call>"


def test_malformed_calls_are_the_agent_s_errors_and_the_run_goes_on(tiny_policy):
    tokenizer = tiny_policy[1]
    replies = [
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": 1 + 2}}\n</tool_call>',  # bad JSON
        _call("multiply", a=2),  # no such tool
        _call("calculate", expression=12),  # the wrong type
        "The answer is 12.",  # no call at all
        _call("calculate", expression="1 +* 2"),  # the tool raises
        _call("calculate", expression="1 + 2") + "\n" + _call("answer", value=3),  # one call too many
    ]
    spec = _spec(max_turns=6, max_actions_per_traj=6, format_penalty=-0.1)
    record = run_rollouts(spec, _scripted(replies)(tokenizer), ChatFormatter(tokenizer, style="compact"), 0)[0]
    errors = [[c["error"] for c in turn.tool_calls] for turn in record.turns]
    assert errors == [["bad_json"], ["unknown_tool"], ["bad_arguments"], [], ["raised"], [None, "not_run"]]
    assert [turn.valid for turn in record.turns] == [False, False, False, False, True, True]
    assert [turn.penalty for turn in record.turns] == [-0.1, -0.1, -0.1, -0.1, 0.0, 0.0]
    assert [len(turn.actions) for turn in record.turns] == [0, 0, 0, 0, 1, 1]
    observations = [turn.observation for turn in record.turns[1:]]
    assert observations[0].startswith("error: the tool call does not parse: not valid JSON (Expecting ',' delimiter")
    assert observations[1] == "error: unknown tool 'multiply'; tools: calculate, answer"
    assert observations[2] == "error: calculate: argument 'expression' must be a string, got 12"
    assert observations[3].startswith("error: the reply called no tool; reply with tool calls only, as: <tool_call>")
    assert observations[4].startswith("error: calculate raised ValueError")
    assert record.turns[-1].tool_calls[1]["result"] == "error: not run: at most 1 tool call(s) in this reply"
    assert record.end_reason == "turn_limit" and record.format_penalty == -0.4
    table = turns_table([record], BatchMeta.training("r", 0, 1.0, "h"))
    assert table.column("tool_calls").to_pylist() == [turn.tool_calls for turn in record.turns]


def test_a_call_holding_a_lone_surrogate_is_bad_json_and_the_turns_are_stored(tiny_policy):
    tokenizer = tiny_policy[1]
    lone = '<tool_call>{"name":"calculate","arguments":{"expression":"\\ud800"}}</tool_call>'  # the reply's text
    replies = [lone, _call("calculate", expression="1 + 2")]
    spec = _spec(max_turns=2, max_actions_per_traj=2, format_penalty=-0.1)
    record = run_rollouts(spec, _scripted(replies)(tokenizer), ChatFormatter(tokenizer, style="compact"), 0)[0]
    first, second = record.turns
    assert first.tool_calls == [
        {
            "name": None,
            "arguments": '{"name":"calculate","arguments":{"expression":"\\ud800"}}',
            "result": "error: the tool call does not parse: holds text that is not valid UTF-8 (the lone surrogate "
            "\\ud800)",
            "error": "bad_json",
            "duration_s": 0.0,
        }
    ]
    assert (first.valid, first.penalty, first.actions) == (False, -0.1, [])
    assert second.observation == first.tool_calls[0]["result"] and second.tool_calls[0]["result"] == "3"
    table = turns_table([record], BatchMeta.training("r", 0, 1.0, "h"))  # raised UnicodeEncodeError before
    assert table.column("tool_calls").to_pylist() == [turn.tool_calls for turn in record.turns]


class Files(ToolEnv):
    """A tool whose result and error hold a lone surrogate (a file name read with surrogateescape)."""

    def reset(self, seed):
        return "Files.", {"success": False}

    def render(self):
        return "Files."

    def instruction(self):
        return "Call ls."

    @property
    def success(self):
        return False

    def reward_bounds(self, max_actions):
        return 0.0, 0.0

    @tool
    def ls(self, fail: bool) -> str:
        """List the files."""
        name = b"report-\xff.txt".decode("utf-8", "surrogateescape")
        if fail:
            raise FileNotFoundError(name)
        return name


def test_a_tool_s_text_that_is_not_utf_8_is_told_escaped_and_stored(tiny_policy):
    tokenizer = tiny_policy[1]
    spec = RolloutSpec(f"{__name__}:Files", [0], 1, 3, 1, 3, enable_think=False)
    replies = [_call("ls", fail=False), _call("ls", fail=True), _call("ls", fail=False)]
    (record,) = run_rollouts(spec, _scripted(replies)(tokenizer), ChatFormatter(tokenizer), 0)
    results = [turn.tool_calls[0]["result"] for turn in record.turns]
    assert results[:2] == ["report-\\udcff.txt", "error: ls raised FileNotFoundError: report-\\udcff.txt"]
    assert [turn.observation for turn in record.turns[1:]] == results[:2]  # what the agent read, as stored
    table = turns_table([record], BatchMeta.training("r", 0, 1.0, "h"))
    assert table.column("tool_calls").to_pylist() == [turn.tool_calls for turn in record.turns]


class Sleepy(ToolEnv):
    """A tool that sleeps as long as it is asked: past env.tool_timeout_s it is abandoned."""

    def reset(self, seed):
        return "Sleep.", {"success": False}

    def render(self):
        return "Sleep."

    def instruction(self):
        return "Call nap."

    @property
    def success(self):
        return False

    def reward_bounds(self, max_actions):
        return 0.0, 0.0

    @tool
    def nap(self, seconds: float) -> str:
        """Sleep a while."""
        time.sleep(seconds)
        return "awake"


def test_a_tool_past_its_time_is_an_error_to_the_agent_never_a_hung_run(tiny_policy):
    tokenizer = tiny_policy[1]
    spec = RolloutSpec(f"{__name__}:Sleepy", [0], 2, 2, 1, 2, enable_think=False, tool_timeout_s=0.3)
    started = time.monotonic()
    backend = _scripted([_call("nap", seconds=60), _call("nap", seconds=0)])(tokenizer)
    records = run_rollouts(spec, backend, ChatFormatter(tokenizer), 0)
    assert time.monotonic() - started < 10
    for record in records:
        (first,), (second,) = (turn.tool_calls for turn in record.turns)
        assert (first["error"], first["result"]) == ("timeout", "error: nap did not return within 0.3 s")
        assert (
            second["error"] is None and second["result"] == "awake" and record.turns[1].observation == first["result"]
        )
        assert np.isfinite(first["duration_s"]) and first["duration_s"] >= 0.3


def test_a_template_that_is_not_prefix_preserving_is_refused_before_any_reply(tiny_policy):
    model, tokenizer = tiny_policy
    recorder = Recorder(HFBackend(model, tokenizer, 1.0, 8))
    formatter = ChatFormatter(thinking_dropped(tokenizer), reply_prefix="<think>")
    with pytest.raises(TemplateError) as caught:
        run_rollouts(_spec(enable_think=True), recorder, formatter, seed=0)
    message = str(caught.value)
    assert message.startswith("the model's chat template is not prefix-preserving") and "\n" not in message
    assert recorder.seen == []  # nothing was sampled, so no row could train on a chat no prompt showed


def test_the_calls_of_a_reply_that_broke_the_format_are_kept_not_run(tiny_policy):
    tokenizer = tiny_policy[1]
    broken = "Let me see. " + _call("calculate", expression="1 + 2") + "\n<tool_call>\n{oops\n</tool_call>"
    replies = [broken, _call("calculate", expression="1 + 2")]
    spec = _spec(max_turns=2, max_actions_per_traj=2, format_penalty=-0.1)
    record = run_rollouts(spec, _scripted(replies)(tokenizer), ChatFormatter(tokenizer, style="compact"), 0)[0]
    first, second = record.turns
    assert [(c["name"], c["error"], c["duration_s"]) for c in first.tool_calls] == [
        ("calculate", "not_run", 0.0),
        (None, "bad_json", 0.0),
    ]
    assert first.tool_calls[0]["result"] == "error: not run: the reply broke the format"
    assert first.tool_calls[1]["arguments"] == "\n{oops\n"  # the call's text, as the reply wrote it
    assert (first.format_ok, first.valid, first.penalty, first.actions) == (False, False, -0.1, [])
    # the agent is told once, in a user message, that nothing ran (not once per call)
    assert second.observation.startswith("error: the reply must hold only tool calls, as: <tool_call>")
    assert [c["error"] for c in second.tool_calls] == [None] and second.actions == [
        ToolCall("calculate", {"expression": "1 + 2"}).text()
    ]


class BadRender(Sleepy):
    """Its tool runs; its render, after the call, raises: the env's own bug, not the agent's."""

    def render(self):
        if getattr(self, "called", False):
            raise KeyError("board")
        return "Sleep."

    @tool
    def nap(self, seconds: float) -> str:
        """Sleep a while."""
        self.called = True
        return "awake"


def test_the_env_s_own_failure_around_a_call_stops_the_run_in_one_line(tiny_policy):
    tokenizer = tiny_policy[1]
    spec = RolloutSpec(f"{__name__}:BadRender", [0], 1, 2, 1, 2, enable_think=False)
    with pytest.raises(UserCodeError) as caught:
        run_rollouts(spec, _scripted([_call("nap", seconds=0)])(tokenizer), ChatFormatter(tokenizer), 0)
    assert str(caught.value) == (
        f'environment {__name__}:BadRender.call(\'{{"name": "nap", "arguments": {{"seconds": 0}}}}\') raised '
        "KeyError: 'board'"
    )
