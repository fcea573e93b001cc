"""Extending a completed run (`ragen resume RUN --force-config trainer.iterations trainer.iterations=N`), through the
real CLI: the extended run is bitwise the run configured longer from the start (tests/flows/test_resume.py's
never-stopped 3-iteration run), a refused or failed extension leaves the completed run as it was, and the answers
that need no flow (done, refused, unknown run) come at once, without a Prefect server."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ragen_core.storage import DataLake
from ragen_core.storage.parts import COMPACTION_MARKER
from tests.flows.test_resume import DISTRIBUTED, RUN, _overrides, _ragen, _rows, _weights

EXTEND = ["--force-config", "trainer.iterations", "trainer.iterations=3"]
QUICK_SECONDS = 15  # an answer without a flow; starting a Prefect server alone takes longer on this machine


def _short_overrides(model_dir):
    return [o if o != "trainer.iterations=3" else "trainer.iterations=2" for o in _overrides(model_dir)]


@pytest.fixture(scope="module")
def completed(tmp_path_factory, tiny_model_dir, prefect_server):
    """A completed 2-iteration run of the reference config (one iteration short), and a pristine copy of it."""
    root = tmp_path_factory.mktemp("short")
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_short_overrides(tiny_model_dir)]
    rc, output = _ragen(train, root, None, prefect_server[0].api_url)
    assert rc == 0, output[-3000:]
    assert DataLake(root).committed_iterations(RUN) == [0, 1, 2]  # 2 updates, then the final validation
    pristine = tmp_path_factory.mktemp("pristine") / "root"
    shutil.copytree(root, pristine, symlinks=True)
    return root, pristine


def _copy(pristine, tmp_path):
    target = tmp_path / "root"
    shutil.copytree(pristine, target, symlinks=True)
    return target


@pytest.fixture(scope="module")
def extended(tmp_path_factory, completed, prefect_server, whole_bandit_run):
    """The completed run extended by one iteration (`ragen resume --force-config ...`), on its own root. While the
    extension runs, `ragen runs compact` of the run is asked from another process (issue 51): the extension then
    also shows that a refused compaction beside it changes nothing of what it makes (bitwise, below), and one
    extension serves both (before, the compaction test ran a second one, ~13 s). Returns (root, the reference run,
    (status, stdout, stderr) of the compaction, the extension's pid)."""
    from tests.flows.test_live_housekeeping import _finish, _start, _wait_for

    root, _ = completed
    log = tmp_path_factory.mktemp("extension") / "extend.log"
    extension = _start(["resume", RUN, *EXTEND], root, log, prefect_server[0].api_url)
    try:
        _wait_for(lambda: _writer_pid(root) == extension.pid, extension, log, "the extension's writer lock")
        rc, out, err, _ = _quick(["runs", "compact", RUN], root)
    finally:
        status = _finish(extension)
    output = log.read_text()
    assert status == 0, output[-3000:]
    assert "resumed at iteration 2" in output and "Traceback" not in output
    # said before it trains (issue 40 s4 item 3): the line comes before iteration 2's line, not only at the end
    said = output.index(f"resuming {RUN} at iteration 2 (extending it to 3 iterations): loading its checkpoint")
    assert said < output.index("iter   2")
    return root, whole_bandit_run, (rc, out, err), extension.pid


def test_the_extended_run_has_bitwise_the_weights_of_the_run_configured_longer(extended):
    root, whole, _, _ = extended
    expected, actual = _weights(whole), _weights(root)  # checkpoints/iteration=3/hf: after the 3rd update
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


def _rows_without(root, table, column):
    rows = [{k: v for k, v in row.items() if k != column} for row in DataLake(root).read_table(table, RUN).to_pylist()]
    return sorted(repr(sorted(row.items())) for row in rows)


@pytest.mark.parametrize("table", ["trajectories", "turns", "metrics", "evaluations"])
def test_the_extended_run_holds_the_rows_of_the_run_configured_longer(extended, table):
    """eval.every=1, so the longer run also validated at iteration 2: even the validation rows agree."""
    root, whole, _, _ = extended
    expected, actual = _rows(whole, table), _rows(root, table)
    assert len(actual) == len(set(actual)) == len(expected)
    if table == "trajectories":  # each row records the hash of the config that made it
        expected, actual = _rows_without(whole, table, "config_hash"), _rows_without(root, table, "config_hash")
    assert actual == expected


def test_trajectories_record_the_config_that_made_them(extended, completed):
    root, whole, _, _ = extended
    hashes = {
        (r["iteration"], r["split"]): r["config_hash"]
        for r in DataLake(root)
        .read_table("trajectories", RUN)
        .select(["iteration", "split", "config_hash"])
        .to_pylist()
    }
    shorter = DataLake(completed[1]).read_manifest(RUN).config_hash
    longer = DataLake(whole).read_manifest(RUN).config_hash
    assert hashes[(0, "train")] == hashes[(1, "train")] == hashes[(2, "val")] == shorter != longer
    assert hashes[(2, "train")] == hashes[(3, "val")] == longer


def test_the_extended_run_is_completed_with_the_longer_config(extended):
    root, whole, _, _ = extended
    lake = DataLake(root)
    manifest = lake.read_manifest(RUN)
    assert manifest.status == "completed"
    assert manifest.config_hash == DataLake(whole).read_manifest(RUN).config_hash
    assert manifest.resumes[-1]["extended_from"] == 2
    assert manifest.resumes[-1]["reused_stages"] == ["eval-bandit"]
    assert lake.committed_iterations(RUN) == [0, 1, 2, 3]
    assert lake.commit_payload(RUN, 2)["updated"] is True and lake.commit_payload(RUN, 3)["updated"] is False


def _quick(args, root):
    """The real CLI with no Prefect server configured: (exit status, stdout, stderr, seconds)."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    script = str(Path(sys.executable).with_name("ragen"))
    start = time.monotonic()
    done = subprocess.run(
        [script, *args, "--data-root", str(root)], capture_output=True, text=True, env=env, timeout=120
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - start


def _here(args, root):
    """The CLI's own code for a command that must answer before any flow, invoked in this process: (exit status,
    stdout, stderr, seconds). A command's own start (~4 s of imports, the same for every command) is measured once
    through a real process (:func:`_quick`, the completed run's answer); each refusal here skips it."""
    from typer.testing import CliRunner

    from ragen_cli.main import app

    start = time.monotonic()
    result = CliRunner().invoke(app, [*args, "--data-root", str(root)])
    seconds = time.monotonic() - start
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.stdout, result.stderr, seconds


def _state(root):
    """What a refused or failed extension must leave as it was: the manifest and the commit markers."""
    lake = DataLake(root)
    manifest = (root / "runs" / RUN / "manifest.json").read_bytes()
    return manifest, {i: lake.commit_payload(RUN, i) for i in lake.committed_iterations(RUN)}


def test_a_completed_run_answers_nothing_to_do_at_once_without_a_server(completed, tmp_path):
    root = _copy(completed[1], tmp_path)
    before = _state(root)
    rc, out, err, seconds = _quick(["resume", RUN], root)
    assert rc == 0, err
    assert f"run {RUN} is already completed; nothing to do" in out
    assert seconds < QUICK_SECONDS, seconds
    assert not (root / "_prefect").exists()  # no Prefect home: no server was started
    assert _state(root) == before


@pytest.mark.parametrize(
    "args, message",
    [
        (["resume", RUN, "trainer.iterations=3"], "changed keys: trainer.iterations"),
        (["resume", RUN, *EXTEND, "actor.lr=0.5"], "changed keys: actor.lr"),
        (["resume", RUN, "--force-config", "trainer", "trainer.iterations=1"], "a run cannot be shortened"),
        (["resume", "no-such-run", *EXTEND], "no run 'no-such-run'"),
        (["train", "--config", "configs/bandit.yaml", "--run-id", RUN], "changed keys"),
    ],
)
def test_a_refused_extension_is_one_line_at_once_and_changes_nothing(completed, tmp_path, args, message):
    root = _copy(completed[1], tmp_path)
    before = _state(root)
    rc, out, err, seconds = _here(args, root)
    assert rc != 0
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err + out, err
    assert seconds < QUICK_SECONDS, seconds
    assert not (root / "_prefect").exists()
    assert _state(root) == before
    assert json.loads(before[0])["status"] == "completed"


def test_a_failed_extension_leaves_the_completed_run_with_its_config(completed, tmp_path, prefect_server):
    """The checkpoint the extension must load is damaged: it fails while restoring, before the lake is changed."""
    root = _copy(completed[1], tmp_path)
    before = _state(root)
    state = root / "runs" / RUN / "checkpoints" / "iteration=2" / "actor" / "state"
    victim = sorted(p for p in state.rglob("*") if p.is_file())[0]
    victim.write_bytes(victim.read_bytes() + b"damaged")
    rc, output = _ragen(["resume", RUN, *EXTEND], root, None, prefect_server[0].api_url)
    assert rc not in (0, None) and "Traceback" not in output, output[-3000:]
    assert "iteration=2" in output  # the message names the damaged checkpoint
    assert _state(root) == before  # status completed, the old config and hash, the same commits
    assert DataLake(root).finished_stages(RUN, 2) == []  # the final validation was not reopened


def test_a_compacted_run_is_not_extended_and_keeps_every_row(tmp_path, tiny_model_dir, prefect_server):
    """`ragen runs compact` merges the final validation's per-env files into one file of no stage: reopening that
    iteration would have discarded it with its rows. The extension is refused in one line and nothing changes."""
    root = tmp_path / "root"
    root.mkdir()
    overrides = [o for o in _short_overrides(tiny_model_dir) if not o.startswith(("env.val_envs", "trainer.iter"))]
    train = [
        "train",
        "--config",
        "configs/bandit.yaml",
        "--run-id",
        RUN,
        *overrides,
        "trainer.iterations=1",
        "env.val_envs=[bandit,bandit_test]",
    ]
    rc, output = _ragen(train, root, None, prefect_server[0].api_url)
    assert rc == 0, output[-3000:]
    rc, _, err, _ = _here(["runs", "compact", RUN], root)
    assert rc == 0, err
    lake = DataLake(root)
    final = lake.committed_iterations(RUN)[-1]
    assert (lake.partition_dir("trajectories", RUN, final) / COMPACTION_MARKER).is_file()  # the premise
    rows = {table: _rows(root, table) for table in ("trajectories", "turns", "metrics", "evaluations")}
    before = _state(root)
    extend = ["--force-config", "trainer.iterations", "trainer.iterations=2"]
    rc, out, err, _ = _here(["resume", RUN, *extend], root)
    assert rc != 0 and "was compacted" in err and "model.path=" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err + out
    assert _state(root) == before
    assert {table: _rows(root, table) for table in rows} == rows


def _writer_pid(root) -> int | None:
    from ragen_core.storage.locks import lock_path, read_holder

    holder = read_holder(lock_path(Path(root).resolve(), RUN))
    return holder.get("pid") if holder else None


def test_a_compaction_beside_a_running_extension_is_refused_naming_it_and_the_extension_completes(extended):
    """Issue 51: `ragen runs compact` while an extension runs used to return 0 and leave the run `failed` (its
    final iteration merged under the extension's feet). It now refuses in one line, naming the extension's process,
    and the extension completes (the extension of the ``extended`` fixture, asked to compact while it held the run's
    writer lock; the tests above find it bitwise the run configured longer)."""
    root, _, (rc, out, err), pid = extended
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err + out, err
    assert f"cannot compact run '{RUN}' now: it is being written by pid {pid}" in err
    lake = DataLake(root)
    assert lake.read_manifest(RUN).status == "completed" and lake.committed_iterations(RUN) == [0, 1, 2, 3]


def test_an_extension_started_during_a_compaction_is_refused_at_once_and_changes_nothing(
    completed, tmp_path, monkeypatch
):
    """The other order: the compaction holds the run's writer lock, so an extension asked meanwhile is refused
    before it changes anything (the run stays completed, its config and commits as they were)."""
    from ragen_core.storage.maintenance import compact_run
    from ragen_core.storage.maintenance import compaction as compaction_module

    root = _copy(completed[1], tmp_path)
    before = _state(root)
    asked = {}
    real_delete = compaction_module.delete_replaced

    def extend_meanwhile(folder, names):
        if not asked:  # the first merged partition: the compaction is under way
            asked["extension"] = _quick(["resume", RUN, *EXTEND], root)
        real_delete(folder, names)

    monkeypatch.setattr(compaction_module, "delete_replaced", extend_meanwhile)
    report = compact_run(DataLake(root), RUN)
    assert report.compacted and asked
    rc, out, err, _ = asked["extension"]
    assert rc != 0 and len(err.strip().splitlines()) == 1 and "Traceback" not in err + out, err
    assert f"is being written by pid {os.getpid()}" in err
    assert _state(root) == before


LIMIT_KB = 2000  # tests/storage/test_space.py's: below a checkpoint's engine state, above every Parquet file


def _exact_rows(root, table):
    """Every row of the run's ``table``, every column (wall-clock times included), sorted."""
    return sorted(repr(sorted(row.items())) for row in DataLake(root).read_table(table, RUN).to_pylist())


def _limited(args, root, api_url, limit_kb):
    """The real CLI under a file-size limit (``ulimit -f``: a write past it fails as on a full disk), talking to the
    session's Prefect server (outside the limit): (exit status, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED} | {"PREFECT_API_URL": api_url}
    script = str(Path(sys.executable).with_name("ragen"))
    command = ["bash", "-c", f'ulimit -f {limit_kb}; exec "$0" "$@"', script, *args, "--data-root", str(root)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=400)
    return done.returncode, done.stdout, done.stderr


def test_an_extension_that_finds_no_space_leaves_the_run_completed_unshortened_and_can_be_tried_again(
    completed, tmp_path, prefect_server, whole_bandit_run
):
    """Issue 66, item 6: the extension's commit of iteration 2 saves the checkpoint after the 3rd update, which the
    file-size limit cuts. The run stays as it was: completed, its config, its final validation committed (iteration 2
    with its rows), not `failed` at iteration 1 with the longer config; the error is one line. Without the limit the
    same extension then gives bitwise the run configured longer."""
    from ragen_core.storage.maintenance.space import SPACE_PREFIX

    root = _copy(completed[1], tmp_path)
    before = _state(root)
    tables = ("trajectories", "turns", "metrics", "evaluations", "events", "checkpoints")
    rows = {table: _exact_rows(root, table) for table in tables}
    rc, out, err = _limited(["resume", RUN, *EXTEND], root, prefect_server[0].api_url, LIMIT_KB)
    assert rc == 2, (out + err)[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {SPACE_PREFIX} while writing "), err[-3000:]
    assert "Traceback" not in out + err
    # what to do is said once, last, and names the extension (the space line's own advice, to resume the run, would
    # find it completed and do nothing)
    assert lines[0].endswith(
        f". The extension was undone: run {RUN} is left completed at 2 iterations, as it was (its config and every "
        "committed row); free space or raise the limit (ulimit -f), then run the same command again to extend it"
    ), lines[0]
    assert lines[0].count("free space") == 1, lines[0]
    lake = DataLake(root)
    manifest = lake.read_manifest(RUN)
    assert (manifest.status, manifest.last_committed_iteration) == ("completed", 2), manifest
    assert _state(root) == before  # the stored manifest (old config and hash), the same commits and payloads
    assert {table: _exact_rows(root, table) for table in tables} == rows  # every committed row, no new one
    assert lake.finished_stages(RUN, 2) == [] and lake.finished_stages(RUN, 3) == []

    rc, output = _ragen(["resume", RUN, *EXTEND], root, None, prefect_server[0].api_url)
    assert rc == 0, output[-3000:]
    assert lake.read_manifest(RUN).status == "completed" and lake.committed_iterations(RUN) == [0, 1, 2, 3]
    expected, actual = _weights(whole_bandit_run), _weights(root)
    assert expected.keys() == actual.keys() and all(torch.equal(expected[k], actual[k]) for k in expected)
    for table in ("turns", "metrics", "evaluations"):
        assert _rows(root, table) == _rows(whole_bandit_run, table), table


def _status_listed(root) -> str:
    rc, out, err, _ = _quick(["runs", "--format", "json"], root)
    assert rc == 0, err
    [row] = [row for row in json.loads(out) if row["run_id"] == RUN]
    return row["status"]


def test_a_running_status_whose_writer_died_after_its_last_commit_is_interrupted_and_resume_completes_it(
    completed, tmp_path
):
    """Issue 66, item 4: a run whose writer died after its last commit (every iteration and the final validation
    committed) keeps a manifest saying `running` with a dead pid. `ragen runs` lists it interrupted (running only
    while a process holds its writer lock), `ragen runs rm` removes it without --force, and `ragen resume` records it
    completed instead of answering "already completed" and leaving it running."""
    from ragen_core.run.entry import open_run
    from ragen_core.storage.maintenance import runs_overview

    root = _copy(completed[1], tmp_path)
    lake = DataLake(root)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid no process has any more
    stored = lake.read_manifest(RUN)
    lake.write_manifest(RUN, stored.updated(status="running", pid=gone.pid))
    with open_run(lake, RUN):  # a live writer (this process): still running
        overview = runs_overview(lake).to_pylist()
        assert [row["status"] for row in overview if row["run_id"] == RUN] == ["running"]
        assert _status_listed(root) == "running"
    assert _status_listed(root) == "interrupted"

    removed = _copy(root, tmp_path / "other")
    rc, out, err, _ = _quick(["runs", "rm", RUN, "--yes"], removed)
    assert rc == 0 and f"removed run {RUN}" in out, err
    assert "(status interrupted)" in out, out

    rc, out, err, seconds = _quick(["resume", RUN], root)
    assert rc == 0 and "already completed" not in out, out + err
    assert f"run {RUN} had committed every iteration and its final validation, but its manifest said 'running'" in out
    manifest = lake.read_manifest(RUN)
    assert (manifest.status, manifest.last_committed_iteration) == ("completed", 2), manifest
    assert manifest.config == stored.config and lake.committed_iterations(RUN) == [0, 1, 2]
    assert seconds < QUICK_SECONDS and not (root / "_prefect").exists()  # no flow, no Prefect server
    rc, out, _, _ = _quick(["resume", RUN], root)
    assert rc == 0 and f"run {RUN} is already completed; nothing to do" in out
