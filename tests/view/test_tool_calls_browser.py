"""A tool env's trajectory in a real headless browser, from `ragen view` started as users start it: each call's row
(tool, arguments, result) in its turn as `ragen sql` reads it from the lake, and the results in the chat as greyed
tool messages, outside the reply's trained tokens."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from selenium.webdriver.common.by import By

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.records import BatchMeta, trajectories_table, turns_table
from ragen_core.storage import DataLake
from schemas.manifest import RunManifest
from tests.view.conftest import start_viewer
from tests.view.test_browser import sql, texts

RUN = "calc-view"


@pytest.fixture(scope="module")
def tool_root(tmp_path_factory, tiny_policy, tiny_model_dir):
    """A lake of one calculator trajectory played by the scripted expert (two calculate calls, then answer)."""
    tokenizer = tiny_policy[1]
    spec = RolloutSpec("calculator", [3], 1, 4, 1, 4, enable_think=False)
    records = run_rollouts(spec, ScriptedBackend("expert", tokenizer), ChatFormatter(tokenizer, style="compact"), 0)
    root = tmp_path_factory.mktemp("tool-view") / "lake"
    lake = DataLake(root)
    stamp = "2025-01-01T00:00:00+00:00"
    manifest = RunManifest(
        run_id=RUN,
        config={},
        config_hash="h",
        seed=0,
        status="completed",
        created_at=stamp,
        updated_at=stamp,
        model_dir=str(tiny_model_dir),
    )
    lake.write_manifest(RUN, manifest)
    meta = BatchMeta.training(RUN, 0, 1.0, "h")
    lake.write_rows("trajectories", RUN, 0, trajectories_table(records, meta), stage="rollout")
    lake.write_rows("turns", RUN, 0, turns_table(records, meta), stage="rollout")
    lake.commit_iteration(RUN, 0, {})
    return root


def test_each_call_shows_in_its_turn_and_its_result_is_greyed_context(browser, tool_root):
    viewer = start_viewer(tool_root)
    try:
        browser.get(viewer.url)
        key = {"split": "train", "env": "calculator", "group": 0, "traj": 0}
        browser.get(f"{viewer.base}/runs/{RUN}/iterations/0/trajectory?{urlencode(key)}")
        calls = sql(
            tool_root,
            "SELECT turn_index, c.name, c.arguments, c.result FROM turns, unnest(tool_calls) AS u(c) "
            "ORDER BY turn_index",
        )
        assert [c["name"] for c in calls] == ["calculate", "calculate", "answer"]
        rows = [
            [cell.text for cell in row.find_elements(By.TAG_NAME, "td")[:3]]
            for row in browser.find_elements(By.CSS_SELECTOR, "tr.tool-call")
        ]
        assert rows == [[c["name"], c["arguments"], c["result"]] for c in calls]
        assert json.loads(rows[0][1])["expression"]  # the arguments as the JSON the agent wrote
        # the results the agent read (all but the last, which ended the episode) as tool messages, greyed
        messages = browser.find_elements(By.CSS_SELECTOR, ".msg.role-tool pre")
        assert [m.text for m in messages] == [c["result"] for c in calls[:-1]]
        tool_colour = browser.find_element(By.CSS_SELECTOR, ".msg.role-tool").value_of_css_property("color")
        reply_colour = browser.find_element(By.CSS_SELECTOR, ".msg.role-reply").value_of_css_property("color")
        assert tool_colour != reply_colour
        assert set(texts(browser, ".msg.role-tool .role")) == {"TOOL RESULT · CONTEXT, NOT TRAINED"}
        # the trained tokens are the replies only: no result among them
        trained = "".join(texts(browser, ".msg.role-reply .tokens"))
        assert all(c["result"] not in trained for c in calls if not c["result"].isdigit())
    finally:
        viewer.stop()
