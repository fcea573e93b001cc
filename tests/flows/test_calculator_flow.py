"""The calculator config through `ragen train` end to end (a bootstrap on the scripted teacher's demonstrations,
then two StarPO-S iterations, tiny sizes), and its tool calls as data: `ragen sql`'s answer to "which tool fails,
at which turn, for which policy" equals the count made in Python from the stored rows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from ragen_core.storage import query
from ragen_core.storage.sqldoc import named_queries

DOC = Path(__file__).resolve().parents[2] / "docs" / "sql.md"


FLAKY = '''
import time

from ragen_core.envs import ToolEnv, tool
from ragen_core.tools import ToolCall, ToolResult


class Flaky(ToolEnv):
    """Count to a target with add, then call done; add raises on 2, nap sleeps past env.tool_timeout_s."""

    def reset(self, seed):
        self.count, self.target, self.won = 0, 3 + seed % 3, False
        return self.render(), {"success": False}

    def render(self):
        return f"count {self.count} of {self.target}"

    def instruction(self):
        return "Reach the target with add, then call done."

    @property
    def success(self):
        return self.won

    def reward_bounds(self, max_actions):
        return 0.0, 1.0

    @tool
    def add(self, amount: int) -> str:
        """Add to the count."""
        if amount == 2:
            raise ValueError("two is unlucky")
        self.count += amount
        return str(self.count)

    @tool
    def nap(self, seconds: float) -> str:
        """Sleep a while."""
        time.sleep(seconds)
        return "awake"

    @tool
    def done(self) -> ToolResult:
        """Stop counting."""
        self.won = self.count == self.target
        return ToolResult("yes" if self.won else "no", float(self.won), done=True)

    def sample_action(self, rng):
        calls = [ToolCall("add", {"amount": 1}), ToolCall("add", {"amount": 2}), ToolCall("nap", {"seconds": 1.0})]
        return (calls + [ToolCall("done", {})])[int(rng.integers(4))].text()
'''

pytestmark = pytest.mark.process  # `ragen train` and `ragen sql` commands


def _ragen(*args: str, timeout: float = 600, path: Path | None = None) -> subprocess.CompletedProcess:
    script = shutil.which("ragen") or str(Path(sys.executable).parent / "ragen")
    dropped = {"PREFECT_HOME", "PREFECT_API_URL", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}
    dropped |= {"MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    if path is not None:  # the user's own code, on PYTHONPATH as a user's would be
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def calculator_root(tmp_path_factory, tiny_model_dir) -> Path:
    root = tmp_path_factory.mktemp("calculator")
    overrides = [
        f"model.path={tiny_model_dir}",
        "rollout.env_groups=2",
        "rollout.group_size=2",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=4",
        "trainer.iterations=2",
        "eval.every=1",
        "eval.instances=2",
        "bootstrap.num_groups=4",
        "bootstrap.epochs=1",
        "bootstrap.batch_size=4",
        "trainer.num_threads=1",
    ]
    result = _ragen(
        "train", "--config", "configs/calculator.yaml", "--data-root", str(root), "--run-id", "calc", *overrides
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def flaky_root(tmp_path_factory, tiny_model_dir) -> Path:
    """Two iterations of a user's tool env whose add raises and whose nap runs past env.tool_timeout_s, its replies
    written by the scripted random policy (so calls of every kind are made from the first turn)."""
    user, root = tmp_path_factory.mktemp("user"), tmp_path_factory.mktemp("flaky")
    (user / "flaky_tools.py").write_text(FLAKY)
    name = "flaky_tools:Flaky"
    overrides = [
        f"model.path={tiny_model_dir}",
        f"env.name={name}",
        f"env.val_envs=[{name}]",
        "env.options={}",
        "env.tool_timeout_s=0.2",
        "rollout.backend=scripted",
        "rollout.scripted_policy=random",
        "rollout.env_groups=2",
        "rollout.group_size=2",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=4",
        "trainer.iterations=2",
        "eval.every=1",
        "eval.instances=2",
        "bootstrap.enabled=false",
        "bootstrap.policy=random",  # the config's teacher_mix needs a teacher, which this env has not
        "trainer.num_threads=1",
    ]
    result = _ragen(
        "train",
        "--config",
        "configs/calculator.yaml",
        "--data-root",
        str(root),
        "--run-id",
        "flaky",
        *overrides,
        path=user,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root


def test_the_config_trains_through_a_bootstrap_then_starpo_s(calculator_root):
    runs = query(calculator_root, "SELECT run_id, kind, status FROM runs ORDER BY kind").to_pylist()
    assert [(r["kind"], r["status"]) for r in runs] == [("bootstrap", "completed"), ("train", "completed")]
    rows = query(
        calculator_root,
        "SELECT iteration, split, count(*) AS n, bool_and(tool_calls IS NOT NULL) AS kept FROM turns t JOIN "
        "(SELECT run_id FROM runs WHERE kind = 'train') USING (run_id) GROUP BY ALL ORDER BY ALL",
    ).to_pylist()
    assert {(r["iteration"], r["split"]) for r in rows} == {
        (0, "train"),
        (1, "train"),
        (0, "val"),
        (1, "val"),
        (2, "val"),
    }
    assert all(r["kept"] for r in rows)  # every turn of a tool env keeps its calls (an empty list when none)
    demos = query(
        calculator_root,
        "SELECT count(*) AS n, bool_and(success) AS solved FROM trajectories JOIN runs USING (run_id) "
        "WHERE kind = 'bootstrap'",
    ).to_pylist()
    assert demos[0]["n"] == 4


@pytest.mark.parametrize(("which", "run"), [("calculator_root", "calc"), ("flaky_root", "flaky")])
def test_ragen_sql_answers_which_tool_fails_as_the_rows_say(request, which, run):
    root = request.getfixturevalue(which)
    sql = named_queries(DOC.read_text())["tool_failures"]
    result = _ragen("sql", sql, "--data-root", str(root), "--run", run, "--format", "json", timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    rows = query(
        root,
        "SELECT t.turn_index, t.tool_calls, j.policy_version FROM turns t JOIN trajectories j USING "
        "(run_id, iteration, split, env, group_id, traj_index) WHERE t.run_id = $run AND t.split = 'train'",
        params={"run": run},
    ).to_pylist()
    calls, failures, errors = Counter(), Counter(), Counter()
    for row in rows:
        for call in row["tool_calls"]:
            key = (call["name"], row["turn_index"], row["policy_version"])
            calls[key] += 1
            failures[key] += call["error"] in ("raised", "timeout")
            errors[key] += call["error"] is not None
    expected = sorted(calls, key=lambda k: (-failures[k], -errors[k], k[0] is None, k[0] or "", k[1], k[2]))
    assert [(r["tool"], r["turn_index"], r["policy_version"]) for r in found] == expected
    assert [(r["calls"], r["failures"], r["errors"]) for r in found] == [
        (calls[k], failures[k], errors[k]) for k in expected
    ]
    if run == "flaky":  # the random policy calls from the first turn: failures of both kinds among them
        assert sum(calls.values()) > 0 and sum(failures.values()) > 0


def test_a_raising_and_a_slow_tool_are_events_and_the_run_goes_on(flaky_root):
    (status,) = query(flaky_root, "SELECT status FROM runs WHERE run_id = 'flaky'").column("status").to_pylist()
    assert status == "completed"
    # per iteration and tool, the calls that raised or ran past env.tool_timeout_s, counted from the turns' rows
    counted = Counter()
    for row in query(flaky_root, "SELECT iteration, split, tool_calls FROM turns WHERE run_id = 'flaky'").to_pylist():
        for call in row["tool_calls"]:
            if call["error"] in ("raised", "timeout"):
                prefix = "rollout" if row["split"] == "train" else "val/Flaky"
                counted[(row["iteration"], f"{prefix}/tool_failures/{call['name']}")] += 1
                assert call["result"] in (
                    "error: add raised ValueError: two is unlucky",
                    "error: nap did not return within 0.2 s",
                )
    events = query(
        flaky_root,
        "SELECT iteration, metric, value, message FROM events WHERE run_id = 'flaky' AND kind = 'tool_error'",
    ).to_pylist()
    metrics = query(
        flaky_root,
        "SELECT iteration, name, value FROM metrics WHERE run_id = 'flaky' AND name LIKE '%/tool_failures/%'",
    ).to_pylist()
    assert {(e["iteration"], e["metric"]): e["value"] for e in events} == {
        (m["iteration"], m["name"]): m["value"] for m in metrics
    }
    assert {(m["iteration"], m["name"]): m["value"] for m in metrics} == {k: float(v) for k, v in counted.items()}
    failed = {metric.rsplit("/", 1)[1] for _, metric in counted}
    assert failed == {"add", "nap"}  # both kinds happened, each told to the agent and the run went on


def test_the_calculator_run_has_its_tool_metrics(calculator_root):
    names = (
        query(calculator_root, "SELECT DISTINCT name FROM metrics WHERE run_id = 'calc'").column("name").to_pylist()
    )
    assert {"rollout/tool_calls", "val/calculator/tool_calls"} <= set(names)
