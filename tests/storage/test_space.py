"""A write that finds no space (issue 29, item 11): a real `ragen train` under a file-size limit (``ulimit -f``:
Python ignores SIGXFSZ, so a write past it fails with EFBIG, and torch's checkpoint writer reports it as "unexpected
pos") stops with one line on stderr saying so and what to do, the run is marked failed with that reason, and the
next `ragen resume` without the limit completes the run with every row. Both commands talk to the session's Prefect
server (outside the limit): the limit then falls on the run's own writes, not on a temporary server's database."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_core.storage import DataLake
from ragen_core.storage.maintenance.space import SPACE_PREFIX, out_of_space
from schemas.manifest import RunManifest
from tests.flows.test_concurrency import DROPPED_ENV
from tests.flows.test_resume import RUN, _overrides

LIMIT_KB = 2000  # below a checkpoint's engine state of the bandit config (about 2.2 MB), above every Parquet file


def _ragen(root: Path, args: list[str], limit_kb: int | None) -> subprocess.CompletedProcess:
    from prefect.settings import PREFECT_API_URL

    script = shutil.which("ragen") or str(Path(sys.executable).parent / "ragen")
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV} | {"PREFECT_API_URL": PREFECT_API_URL.value()}
    limit = f"ulimit -f {limit_kb}; " if limit_kb else ""
    command = ["bash", "-c", f'{limit}exec "$0" "$@"', script, *args, "--data-root", str(root)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=400)


def test_a_file_size_limit_is_one_line_a_failed_run_and_a_resume_completes(prefect_harness, tmp_path, tiny_model_dir):
    root = tmp_path / "lake"
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_overrides(tiny_model_dir)]
    stopped = _ragen(root, train, LIMIT_KB)

    assert stopped.returncode == 2, stopped.stderr[-3000:]
    lines = stopped.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {SPACE_PREFIX} while writing "), stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stdout + stopped.stderr
    manifest = DataLake(root).read_manifest(RUN)
    # the run's own writes (the checkpoint, the commit) hit the limit: the run says so, and resumes
    assert lines[0].endswith(f"then `ragen resume {RUN}`"), lines[0]
    assert manifest.status == "failed" and manifest.error == lines[0].removeprefix("error: ")
    resumed = _ragen(root, ["resume", RUN], None)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    lake = DataLake(root)
    assert lake.read_manifest(RUN).status == "completed"
    trajectories = lake.read_table("trajectories", RUN)
    # 3 iterations of 2 groups x 4 trajectories, and 4 validations (before and after each update) of 2 trajectories
    assert trajectories.num_rows == 3 * 2 * 4 + 4 * 2
    keys = {tuple(r[k] for k in ("iteration", "split", "group_id", "traj_index")) for r in trajectories.to_pylist()}
    assert len(keys) == trajectories.num_rows  # no row twice
    assert lake.committed_iterations(RUN) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (OSError(errno.EFBIG, "File too large"), True),
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2037312 vs 2037200"), True),
        (OSError(errno.EACCES, "Permission denied"), False),
        (ValueError("bad value"), False),
    ],
)
def test_what_counts_as_a_write_that_found_no_space(error, expected):
    assert out_of_space(error) is expected
    try:  # the same error, raised while handling another (what the orchestration layer's error carries)
        try:
            raise error
        except BaseException as inner:
            raise RuntimeError("Server error '500 Internal Server Error'") from inner
    except RuntimeError as outer:
        assert out_of_space(outer) is expected


def test_a_want_of_space_recorded_by_an_earlier_command_is_not_a_later_failures_cause(tmp_path):
    """A run failed on a full disk; space was freed and a resume failed for another reason before it wrote its
    manifest: that failure is recorded and reported as itself, not as the earlier want of space."""
    from ragen_core.run.record import RunRecord
    from ragen_core.storage.maintenance.space import space_failure, space_message

    lake = DataLake(tmp_path)
    stale = space_message("r", "iteration 0, stage commit")
    manifest = {"run_id": "r", "status": "failed", "error": stale, "updated_at": "2026-01-01T00:00:00+00:00"}
    lake.write_manifest("r", RunManifest(**manifest))
    later = RuntimeError("the vLLM server could not load the model")
    assert space_failure(tmp_path, "r", later, recorded_since="2026-06-01T00:00:00+00:00") is None
    assert space_failure(tmp_path, "r", later, recorded_since="2025-12-31T00:00:00+00:00") == stale  # this command's
    assert space_failure(tmp_path, "r", later) is None  # no time given: the manifest is not read
    RunRecord(lake, "r", RunManifest(**manifest)).stopped(later)
    recorded = lake.read_manifest("r")
    assert recorded.status == "failed" and "could not load the model" in recorded.error
    assert not recorded.error.startswith(SPACE_PREFIX)
