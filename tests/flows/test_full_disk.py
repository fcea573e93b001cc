"""Training onto a full disk (issue 39, "not yet attacked"): the data root on a small tmpfs, filled so that the run
finds no space part-way (the Parquet files, the records of published parts, a checkpoint, the manifest). The command
stops with one line saying so and what to do, exit 2, no traceback; once space is freed, `ragen resume` completes the
run with bitwise the same weights and the same rows as the run that never stopped (tests/flows/test_resume.py's
reference run), every row once.

Mounting a tmpfs needs root; elsewhere the test is skipped (tests/storage/test_space.py reaches the same code with a
file-size limit, ``ulimit -f``, which needs no privilege)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragen_core.storage import DataLake
from ragen_core.storage.maintenance.space import SPACE_PREFIX
from tests.flows.test_resume import DISTRIBUTED, RUN, _overrides, _rows, _wait_then_reap, _weights

TABLES = ["trajectories", "turns", "metrics", "evaluations"]


@pytest.fixture()
def small_disk(tmp_path):
    """A 64 MB tmpfs at ``tmp_path/disk`` (unmounted afterwards); skipped where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({done.stderr.decode().strip()}): tests/storage/test_space.py covers "
            "a write that finds no space with a file-size limit"
        )
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _size(root: Path) -> int:
    """Bytes the run's own files take (the reference run's: what training needs on the disk)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.name.startswith(".log-"))


def _ragen(args: list[str], root: Path, log: Path, api_url: str) -> tuple[int, str, str]:
    """The installed CLI (its output outside the full disk); whatever it leaves behind is killed afterwards."""
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED}
    env["PREFECT_API_URL"] = api_url  # one server outside the small disk: the run's own writes are what fill it
    with open(log, "w") as out, open(log.with_suffix(".err"), "w") as err:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("ragen")), *args, "--data-root", str(root)],
            stdout=out,
            stderr=err,
            env=env,
            start_new_session=True,
        )
        _wait_then_reap(process, 400)
    return process.returncode, log.read_text(), log.with_suffix(".err").read_text()


@pytest.mark.parametrize("share", [0.3, 0.75], ids=["early", "late"])
def test_a_full_disk_stops_in_one_line_and_a_resume_after_freeing_space_is_bitwise_the_same(
    small_disk, tmp_path, tiny_model_dir, prefect_server, whole_bandit_run, share
):
    whole = whole_bandit_run
    needed = _size(whole)
    free = shutil.disk_usage(small_disk).free
    filler = small_disk / "filler"
    with open(filler, "wb") as handle:  # leave ``share`` of what the run needs
        handle.truncate(0)
        handle.write(b"\0" * (free - int(needed * share)))
    root = small_disk / "lake"
    api_url = prefect_server[0].api_url
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *_overrides(tiny_model_dir)]

    rc, out, err = _ragen(train, root, tmp_path / "train.log", api_url)
    assert rc == 2, (out + err)[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {SPACE_PREFIX} while writing "), err[-3000:]
    assert lines[0].endswith(f"then `ragen resume {RUN}`"), lines[0]
    assert "Traceback" not in out + err
    lake = DataLake(root)
    manifest = lake.read_manifest(RUN)
    assert manifest is not None and manifest.status == "failed", manifest
    assert manifest.error == lines[0].removeprefix("error: ")
    assert lake.committed_iterations(RUN) != [0, 1, 2, 3]  # it really stopped part-way

    filler.unlink()  # space freed
    rc, out, err = _ragen(["resume", RUN], root, tmp_path / "resume.log", api_url)
    assert rc == 0, (out + err)[-3000:]
    assert lake.read_manifest(RUN).status == "completed"
    assert lake.committed_iterations(RUN) == [0, 1, 2, 3]
    expected, actual = _weights(whole), _weights(root)
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    for table in TABLES:
        rows = _rows(root, table)
        assert len(rows) == len(set(rows)) and rows == _rows(whole, table), table
