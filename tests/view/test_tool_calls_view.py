"""`ragen view` shows a tool env's trajectory: each call with its arguments, result, error and seconds in the turn,
and the results in the chat as tool messages, context the update never trains on (not among the reply's tokens)."""

from __future__ import annotations

import html
import re

from fastapi.testclient import TestClient

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.records import BatchMeta, trajectories_table, turns_table
from ragen_core.storage import DataLake
from ragen_view import tokens
from ragen_view.app import create_app
from schemas.manifest import RunManifest


def test_each_call_and_its_result_show_in_the_turn(tiny_policy, tiny_model_dir, tmp_path):
    tokenizer = tiny_policy[1]
    spec = RolloutSpec("calculator", [3], 1, 4, 1, 4, enable_think=False)
    (record,) = run_rollouts(spec, ScriptedBackend("expert", tokenizer), ChatFormatter(tokenizer, style="compact"), 0)
    lake = DataLake(tmp_path)
    stamp = "2025-01-01T00:00:00+00:00"
    manifest = RunManifest(
        run_id="calc",
        config={},
        config_hash="h",
        seed=0,
        status="completed",
        created_at=stamp,
        updated_at=stamp,
        model_dir=str(tiny_model_dir),
    )
    lake.write_manifest("calc", manifest)
    meta = BatchMeta.training("calc", 0, 1.0, "h")
    lake.write_rows("trajectories", "calc", 0, trajectories_table([record], meta), stage="rollout")
    lake.write_rows("turns", "calc", 0, turns_table([record], meta), stage="rollout")
    lake.commit_iteration("calc", 0, {})
    client = TestClient(create_app(lake.root), base_url="http://127.0.0.1")
    page = client.get(
        "/runs/calc/iterations/0/trajectory", params={"split": "train", "env": "calculator", "group": 0, "traj": 0}
    )
    assert page.status_code == 200, page.text
    text = html.unescape(page.text)
    calls = [turn.tool_calls[0] for turn in record.turns]
    rows = re.findall(r'<tr class="tool-call[^"]*"><td>(.*?)</td><td><code>(.*?)</code></td><td>(.*?)</td>', text)
    assert rows == [(c["name"], c["arguments"], c["result"]) for c in calls]
    tool_messages = re.findall(
        r'<div class="msg role-tool"><span class="role">tool result · context, not trained</span><pre>(.*?)</pre>',
        text,
        re.S,
    )
    assert tool_messages == [c["result"] for c in calls[:-1]]  # the last result ends the episode: never shown to it
    # the reply's tokens (trained) are the reply and its stop token: no tool result among them
    paragraphs = re.findall(r'<p class="tokens">(.*?)</p>', page.text, re.S)
    replies = [html.unescape(re.sub(r"<span[^>]*>|</span>", "", p)) for p in paragraphs]
    assert replies == [turn.response + "<|im_end|>" for turn in record.turns]


def test_a_user_turn_of_tool_results_reads_as_tool_messages():
    results = "<tool_response>\n3391\n</tool_response>\n<tool_response>\nerror: x\n</tool_response>"
    context = f"<|im_start|>user\n{results}<|im_end|>\n"
    assert [(m.role, m.text) for m in tokens._messages(context)] == [("tool", "3391"), ("tool", "error: x")]
    plain = "<|im_start|>user\nhello <tool_response>\nx\n</tool_response><|im_end|>\n"
    assert [m.role for m in tokens._messages(plain)] == ["user"]
