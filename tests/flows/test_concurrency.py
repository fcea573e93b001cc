"""Several writers and readers on one data root.

- Two ``ragen train`` processes at once (one data root, each with its own Prefect home as the CLI sets up) store
  exactly the rows each run stores when made alone.
- A reader polling while partitions are published and compacted sees every partition whole or not at all.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from ragen_core.storage import DataLake, query
from ragen_core.storage.maintenance import compact_run
from ragen_core.storage.maintenance import compaction as compaction_module
from tests.flows.test_resume import RUN, _overrides
from tests.storage.synthetic import make_batch

# a fresh user shell: no Prefect settings and no distributed variables left by DeepSpeed in this test process
DROPPED_ENV = {
    "PREFECT_HOME",
    "PREFECT_API_URL",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
}
KEY = ["run_id", "iteration", "split", "env", "group_id", "traj_index"]
TABLE_KEYS = {
    "trajectories": KEY,
    "turns": KEY + ["turn_index"],
    "metrics": ["iteration", "name"],
    "evaluations": ["iteration", "env"],
    "events": ["iteration", "kind", "metric"],
}
WALL_CLOCK_METRICS = ("time/", "perf/")  # wall-clock figures (and the update's cost): allowed to differ between runs


def _train(
    root: Path, run_id: str, model_dir: Path, seed: int | None = None, api_url: str | None = None
) -> subprocess.Popen:
    """`ragen train` of the exact-resume tests' config (tests/flows/test_resume.py; another ``seed`` if given), from
    a fresh user shell: no Prefect settings, so the command starts its own temporary server in its own home (or,
    with ``api_url``, talks to that server)."""
    script = shutil.which("ragen") or str(Path(sys.executable).parent / "ragen")
    overrides = _overrides(model_dir)
    if seed is not None:
        overrides = [o for o in overrides if not o.startswith("seed=")] + [f"seed={seed}"]
    command = [script, "train", "--config", "configs/bandit.yaml", "--data-root", str(root), "--run-id", run_id]
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV} | (
        {"PREFECT_API_URL": api_url} if api_url else {}
    )
    return subprocess.Popen(command + overrides, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _finish(process: subprocess.Popen, timeout: float = 400) -> None:
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output[-4000:]


def _rows(root: Path, run_id: str) -> dict[str, list[dict]]:
    """The run's stored rows per table, in key order, without wall-clock values."""
    lake = DataLake(root)
    rows = {}
    for table, key in TABLE_KEYS.items():
        data = lake.read_table(table, run_id)
        data = data.drop_columns([c for c in ("created_at",) if c in data.column_names])
        listed = sorted(data.to_pylist(), key=lambda r, k=key: [str(r[c]) for c in k])
        if table == "metrics":
            listed = [r for r in listed if not r["name"].startswith(WALL_CLOCK_METRICS)]
        rows[table] = listed
    return rows


@pytest.mark.slow
def test_two_concurrent_runs_store_the_rows_each_stores_alone(tmp_path, tiny_model_dir, whole_bandit_run):
    shared = tmp_path / "shared"
    first, second = _train(shared, RUN, tiny_model_dir), _train(shared, "run-b", tiny_model_dir, seed=11)
    _finish(first)
    _finish(second)
    alone = whole_bandit_run  # the same command and config made alone (on the session's Prefect server)

    assert (shared / "_prefect" / RUN).is_dir() and (shared / "_prefect" / "run-b").is_dir()
    together, by_itself = _rows(shared, RUN), _rows(alone, RUN)
    assert len(together["trajectories"]) == 3 * 8 + 4 * 2  # 3 iterations x 2x4 train, 4 validations x 2
    assert len(together["turns"]) == len(together["trajectories"])  # bandit: one turn each
    for table, rows in together.items():
        assert rows == by_itself[table], table
    other = _rows(shared, "run-b")
    assert len(other["trajectories"]) == len(together["trajectories"])
    assert [r["env_seed"] for r in other["trajectories"]] != [r["env_seed"] for r in together["trajectories"]]
    assert query(shared, "SELECT count(DISTINCT run_id) AS n FROM trajectories").to_pylist() == [{"n": 2}]
    manifests = [DataLake(shared).read_manifest(r) for r in (RUN, "run-b")]
    assert all(m.created_at <= n.updated_at for m in manifests for n in manifests)  # their runs overlapped
    if (Path(__file__).resolve().parents[2] / ".git").exists():  # the manifest names the code that ran
        assert all(re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", m.git_commit) for m in manifests)


class _Poller(threading.Thread):
    """Counts the turns rows of every iteration of one run, over and over, through DuckDB and the Python reader."""

    def __init__(self, lake: DataLake, run_id: str) -> None:
        super().__init__(daemon=True)
        self.lake, self.run_id = lake, run_id
        self.seen: dict[int, list[int]] = defaultdict(list)
        self.errors: list[BaseException] = []
        self.polls = 0
        self.stop = threading.Event()

    def run(self) -> None:
        statement = f"SELECT iteration, count(*) AS n FROM turns WHERE run_id = '{self.run_id}' GROUP BY 1"
        while not self.stop.is_set():
            try:
                if self.polls % 2 == 0:
                    counts = {r["iteration"]: r["n"] for r in query(self.lake, statement).to_pylist()}
                else:
                    iterations = self.lake.read_table("turns", self.run_id, columns=["iteration"])["iteration"]
                    counts = defaultdict(int)
                    for i in iterations.to_pylist():
                        counts[i] += 1
            except Exception as exc:  # reported by the test, never swallowed
                self.errors.append(exc)
                return
            for iteration, n in counts.items():
                self.seen[iteration].append(n)
            self.polls += 1

    def observe(self, pause: float) -> None:
        """Let at least one more poll happen."""
        target = self.polls + 1
        while self.polls < target and self.is_alive():
            time.sleep(pause)


def _slow_delete(real, pause: float):
    def delete(folder, names):
        for name in names:  # one file at a time, with readers polling in between
            time.sleep(pause)
            real(folder, [name])

    return delete


def test_readers_see_each_partition_whole_or_not_at_all(tmp_path, monkeypatch):
    import numpy as np

    lake, run_id, iterations = DataLake(tmp_path), "w", 6
    rng = np.random.default_rng(0)
    sizes: dict[int, tuple[int, int]] = {}
    poller = _Poller(lake, run_id)
    poller.start()
    for iteration in range(iterations):  # publish: a rollout part, then an eval part per partition
        train = make_batch(rng, run_id, "sokoban", iteration, "train", 2 + iteration, 4, 0.5)
        val = make_batch(rng, run_id, "sokoban", iteration, "val", 3, 2, 0.5)
        for stage, batch in (("rollout", train), ("eval-sokoban", val)):
            lake.write_rows("trajectories", run_id, iteration, [t.row() for t in batch], stage=stage)
            lake.write_rows("turns", run_id, iteration, [r for t in batch for r in t.turn_rows()], stage=stage)
            poller.observe(0.005)
        sizes[iteration] = (sum(len(t.turns) for t in train), sum(len(t.turns) for t in train + val))
        lake.commit_iteration(run_id, iteration, {})
    publish_polls = poller.polls
    monkeypatch.setattr(compaction_module, "delete_replaced", _slow_delete(compaction_module.delete_replaced, 0.05))
    compacted_at = {}
    for iteration in range(iterations):
        poller.observe(0.005)
        compacted_at[iteration] = len(poller.seen[iteration])
    report = compact_run(lake, run_id)
    poller.observe(0.005)
    poller.stop.set()
    poller.join(timeout=30)

    assert not poller.errors, poller.errors
    assert len(report.compacted) == 2 * iterations and poller.polls > publish_polls + 5
    for iteration, (rollout_only, whole) in sizes.items():
        seen = poller.seen[iteration]
        assert set(seen) <= {rollout_only, whole}, (iteration, sorted(set(seen)))  # never a torn or doubled count
        assert set(seen[compacted_at[iteration] :]) == {whole}, iteration  # during and after compaction: all rows
