"""Every row counts once (issue 39, item 3): readers take only the part files the lake published into a partition
(its record, ``_commits/<run>/parts/<table>/iteration=<n>.json``), and refuse the table in one line naming any other
file: a copy under a valid-looking name, a hard link under an odd name, a file with the right name but another
partition's rows, a part of another run, a recorded name whose file was replaced. Before, ``ragen sql`` counted
the copies' rows (384 of 128), and `select_trajectories`, `ragen export` and `ragen runs compact` took them too.

Each variant is planted in a copy of a real data root (two tiny Bandit runs made by the `train` flow, the first
compacted: :mod:`tests.storage.real_lake`); the expected counts come from the runs' configs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.run.offline import select_trajectories
from ragen_core.storage import DataLake, LakeError, Stage, query
from ragen_core.storage.layout import parts_record_of, published_part_name
from ragen_core.storage.maintenance.export import export_dataset
from ragen_core.storage.maintenance.upgrade import upgrade_layout
from ragen_core.training.offline import OfflineError
from tests.storage.real_lake import RUNS, configured_counts, make_real_lake

RUN = RUNS[1]  # not compacted: a partition of several published parts
ITERATION = 1


@pytest.fixture(scope="module")
def pristine(prefect_harness, tmp_path_factory, tiny_model_dir) -> Path:
    return make_real_lake(tmp_path_factory.mktemp("published") / "lake", tiny_model_dir)


@pytest.fixture()
def lake(pristine, tmp_path) -> DataLake:
    return DataLake(shutil.copytree(pristine, tmp_path / "lake"))


def _cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def _refused(result, *expected: str) -> None:
    """Exit status 2, nothing on stdout, one ``error:`` line on stderr holding ``expected``, no traceback."""
    assert result.exit_code == 2, result.output
    assert result.stdout == "", result.stdout
    assert result.stderr.startswith("error:") and "Traceback" not in result.output, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    text = " ".join(result.stderr.split())
    for piece in expected:
        assert piece in text, (piece, text)


def _count(root: Path, *extra: str) -> int:
    result = _cli("sql", "SELECT count(*) AS n FROM trajectories", "--data-root", root, "-f", "json", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)[0]["n"]


def _configured(run_id: str | None = None) -> int:
    return sum(n for (run, _, _), n in configured_counts().items() if run_id in (None, run))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.parquet"))}


def _rollout_part(lake: DataLake, run_id: str = RUN, iteration: int = ITERATION) -> Path:
    return lake.partition_dir("trajectories", run_id, iteration) / published_part_name(Stage.ROLLOUT, 0)


# each plants one file in the partition (RUN, ITERATION) of trajectories; returns it and the words of the refusal
def _copy(lake: DataLake) -> tuple[Path, str]:
    source = _rollout_part(lake)
    stray = source.with_name(published_part_name(Stage.ROLLOUT, 1))  # part-<h>-00001 beside part-<h>-00000
    shutil.copy(source, stray)
    return stray, "is not among the parts the lake published"


def _hard_link(lake: DataLake) -> tuple[Path, str]:
    source = _rollout_part(lake)
    stray = source.with_name("part-zz-0.parquet")
    os.link(source, stray)
    return stray, "is not among the parts the lake published"


def _other_partitions_rows(lake: DataLake) -> tuple[Path, str]:
    """The right name (a recorded one), but iteration 0's rows of the same stage."""
    target = _rollout_part(lake)
    shutil.copy(_rollout_part(lake, iteration=0), target)
    return target, "holds rows with iteration = 0"


def _other_runs_part(lake: DataLake) -> tuple[Path, str]:
    """The compacted run's merged file of the same iteration, under a valid-looking name."""
    (merged,) = lake.partition_files("trajectories", RUNS[0], ITERATION)
    stray = _rollout_part(lake).with_name(published_part_name(Stage.ROLLOUT, 1))
    shutil.copy(merged, stray)
    return stray, f"holds rows with run_id = '{RUNS[0]}'"


def _replaced_by_a_sibling(lake: DataLake) -> tuple[Path, str]:
    """A recorded name now holding another published part of the same partition (its rows are the partition's)."""
    target = _rollout_part(lake)
    sibling = next(p for p in lake.partition_files("trajectories", RUN, ITERATION) if p != target)
    shutil.copy(sibling, target)
    return target, "it was replaced"


def _record_removed(lake: DataLake) -> tuple[Path, str]:
    """The copy, with the partition's record deleted too: a data root that keeps records refuses the partition."""
    stray, _ = _copy(lake)
    parts_record_of(stray.parent).unlink()
    return stray.parent, "without a record of the parts the lake published there"


PLANTS = {
    "copy": _copy,
    "hard link": _hard_link,
    "other partition's rows": _other_partitions_rows,
    "other run's part": _other_runs_part,
    "replaced by a sibling": _replaced_by_a_sibling,
    "record removed": _record_removed,
}


def test_the_real_lake_reads_every_configured_row_once(lake):
    assert _count(lake.root) == _configured() == 2 * (2 * 8 + 3 * 6)
    assert _count(lake.root, "--run", RUN) == _configured(RUN)


@pytest.mark.parametrize("plant", PLANTS.values(), ids=PLANTS.keys())
def test_every_reader_refuses_a_part_the_lake_did_not_publish(lake, plant, tmp_path):
    stray, why = plant(lake)
    before = _files(lake.root)
    _refused(_cli("sql", "SELECT count(*) FROM trajectories", "--data-root", lake.root), str(stray), why)
    _refused(
        _cli("sql", "SELECT count(*) FROM trajectories WHERE iteration = 0", "--data-root", lake.root, "--run", RUN),
        str(stray),
    )
    with pytest.raises(LakeError, match=str(stray)):
        lake.read_table("trajectories", RUN)
    with pytest.raises(LakeError, match=str(stray)):  # retrain --from: the lake's own refusal
        select_trajectories(lake, "SELECT * FROM trajectories WHERE split = 'train'")
    _refused(_cli("export", RUN, "--out", tmp_path / "out", "--data-root", lake.root), str(stray))
    assert not (tmp_path / "out").exists()
    with pytest.raises(LakeError, match=str(stray)):
        export_dataset(lake, tmp_path / "out2", [RUN], ["trajectories"])
    _refused(_cli("runs", "compact", RUN, "--data-root", lake.root), str(stray))
    assert _files(lake.root) == before  # nothing merged, nothing deleted
    # the other run and the other tables still answer, with their configured counts
    assert _count(lake.root, "--run", RUNS[0]) == _configured(RUNS[0])
    assert query(lake, "SELECT count(*) AS n FROM turns").to_pylist()[0]["n"] > 0


@pytest.mark.parametrize("plant", [_copy, _hard_link, _other_runs_part], ids=["copy", "hard link", "other run"])
def test_once_the_stray_file_is_moved_out_every_row_counts_once(lake, plant, tmp_path):
    stray, _ = plant(lake)
    shutil.move(stray, tmp_path / "moved.parquet")
    assert _count(lake.root) == _configured()
    assert _cli("runs", "compact", RUN, "--data-root", lake.root).exit_code == 0
    assert _count(lake.root) == _configured()
    assert len(lake.partition_files("trajectories", RUN, ITERATION)) == 1  # merged: and recorded as published


def test_ragen_runs_refuses_a_copied_part_of_a_table_it_reads(lake):
    (source,) = lake.partition_files("evaluations", RUNS[0], ITERATION)
    stray = source.with_name("part-copy-00000.parquet")
    shutil.copy(source, stray)
    _refused(_cli("runs", "--data-root", lake.root), str(stray), "is not among the parts the lake published")


def test_removing_a_run_with_a_stray_part_still_removes_everything(lake):
    stray, _ = _copy(lake)
    result = _cli("runs", "rm", RUN, "--yes", "--data-root", lake.root)
    assert result.exit_code == 0, result.output
    assert not stray.exists() and not lake.run_partition_dir("trajectories", RUN).exists()
    assert _count(lake.root) == _configured(RUNS[0])


def _as_written_before_records(root: Path) -> None:
    """The data root as ragen-flows wrote it before the records were kept: no records, no ``part_records``."""
    shutil.rmtree(root / "_commits" / RUNS[0] / "parts")
    shutil.rmtree(root / "_commits" / RUN / "parts")
    (root / "_layout.json").write_text(json.dumps({"layout_version": 2}))


def test_a_data_root_written_before_the_records_reads_whole_until_the_upgrade_records_it(lake):
    _as_written_before_records(lake.root)
    assert _count(lake.root) == _configured()  # read as before
    partitions = {p.parent for p in lake.root.glob("*/run-*/iteration-*/part-*.parquet")}
    result = _cli("upgrade-lake", "--data-root", lake.root)
    assert result.exit_code == 0, result.output
    assert f"recorded the published parts of {len(partitions)} partition(s)" in " ".join(result.output.split())
    assert json.loads((lake.root / "_layout.json").read_text()) == {"layout_version": 2, "part_records": True}
    assert _count(lake.root) == _configured()
    stray, why = _copy(lake)  # from now on a copy is refused there too
    _refused(_cli("sql", "SELECT count(*) FROM trajectories", "--data-root", lake.root), str(stray), why)


def test_the_upgrade_refuses_to_record_a_second_name_of_a_file(lake):
    _as_written_before_records(lake.root)
    source = _rollout_part(lake)
    link = source.with_name("part-zz-0.parquet")
    os.link(source, link)
    with pytest.raises(LakeError, match="hard link"):
        upgrade_layout(lake)
    assert not (lake.root / "_commits" / RUN / "parts").exists()  # nothing recorded
    _refused(_cli("upgrade-lake", "--data-root", lake.root), str(link), "second name")


def _forged_record(lake: DataLake) -> Path:
    """Issue 51's first forgery: a part copied under a new part number and added to the partition's record with the
    original's size, so that the record vouches for it."""
    stray, _ = _copy(lake)
    record = parts_record_of(stray.parent)
    payload = json.loads(record.read_text())
    payload["parts"][stray.name] = stray.stat().st_size
    record.write_text(json.dumps(payload))
    return stray


def _repaired_as_the_error_said(lake: DataLake) -> Path:
    """Issue 51's second forgery: the repair a refusal used to suggest (layout 2 without records), then a copy."""
    _as_written_before_records(lake.root)
    stray, _ = _copy(lake)
    return stray


FORGERIES = {"forged record": _forged_record, "records removed": _repaired_as_the_error_said}


@pytest.mark.parametrize("forge", FORGERIES.values(), ids=FORGERIES.keys())
def test_a_copied_part_counts_once_whatever_the_records_say(lake, forge, tmp_path):
    """Before: `ragen sql` counted the copy's rows twice, export exported them, compaction merged them for good,
    retrain selected them, and `ragen upgrade-lake` recorded the copy as published. Every one now refuses in one
    line naming the copy, and nothing is written."""
    stray = forge(lake)
    before = _files(lake.root)
    why = "is a byte-for-byte copy of"
    _refused(_cli("sql", "SELECT count(*) FROM trajectories", "--data-root", lake.root), str(stray), why)
    _refused(_cli("export", RUN, "--out", tmp_path / "out", "--data-root", lake.root), str(stray), why)
    assert not (tmp_path / "out").exists()
    with pytest.raises(LakeError, match=str(stray)):  # retrain --from: the lake's own refusal
        select_trajectories(lake, "SELECT * FROM trajectories WHERE split = 'train'")
    _refused(_cli("runs", "compact", RUN, "--data-root", lake.root), str(stray), why)
    if forge is _repaired_as_the_error_said:  # the upgrade would record the copy as published
        _refused(_cli("upgrade-lake", "--data-root", lake.root), str(stray), why)
        assert not (lake.root / "_commits" / RUN / "parts").exists()
    assert _files(lake.root) == before
    stray.unlink()  # the copy moved out: every row counts once again
    assert _count(lake.root) == _configured()


def test_compaction_refuses_rows_that_repeat_a_key_in_other_bytes(lake):
    """A copy re-encoded (other bytes, the same rows) and recorded: the merge, which would make the duplicates
    permanent, refuses the partition before anything is written."""
    source = _rollout_part(lake)
    stray = source.with_name(published_part_name(Stage.ROLLOUT, 1))
    pq.write_table(pq.read_table(source), stray, compression="none")  # the same rows, other bytes
    assert stray.read_bytes() != source.read_bytes()
    record = parts_record_of(stray.parent)
    payload = json.loads(record.read_text())
    payload["parts"][stray.name] = stray.stat().st_size
    record.write_text(json.dumps(payload))
    before = _files(lake.root)
    _refused(_cli("runs", "compact", RUN, "--data-root", lake.root), "hold rows of the same key", str(stray))
    assert _files(lake.root) == before


# -- issue 66: a copy in other bytes repeats the keys of the part it copies -----------------------------------------
def _re_encoded(lake: DataLake, statistics: bool = True) -> tuple[Path, Path]:
    """The rollout part read and written again gzip-compressed under the next part number (other bytes, the same
    rows); ``statistics=False`` writes no footer statistics, so no key range tells the two files apart."""
    source = _rollout_part(lake)
    stray = source.with_name(published_part_name(Stage.ROLLOUT, 1))
    pq.write_table(pq.read_table(source), stray, compression="gzip", write_statistics=statistics)
    assert stray.read_bytes() != source.read_bytes()
    return source, stray


def _forge_entry(stray: Path) -> None:
    record = parts_record_of(stray.parent)
    payload = json.loads(record.read_text())
    payload["parts"][stray.name] = stray.stat().st_size
    record.write_text(json.dumps(payload))


def _re_encoded_forged(lake: DataLake) -> tuple[Path, Path]:
    source, stray = _re_encoded(lake)
    _forge_entry(stray)
    return source, stray


def _re_encoded_without_statistics(lake: DataLake) -> tuple[Path, Path]:
    source, stray = _re_encoded(lake, statistics=False)
    _forge_entry(stray)
    return source, stray


def _re_encoded_records_removed(lake: DataLake) -> tuple[Path, Path]:
    """The legacy layout text an error used to suggest (no records kept), the records deleted, then the copy."""
    _as_written_before_records(lake.root)
    return _re_encoded(lake)


RE_ENCODED = {
    "forged record": _re_encoded_forged,
    "no statistics, forged record": _re_encoded_without_statistics,
    "records removed": _re_encoded_records_removed,
}


@pytest.mark.parametrize("forge", RE_ENCODED.values(), ids=RE_ENCODED.keys())
def test_a_re_encoded_copy_counts_once_whatever_the_records_say(lake, forge, tmp_path):
    """Before: `ragen sql` counted the copy's rows (train rows twice), `ragen export` exported them, `ragen retrain
    --from` selected them, the trainer read them and `ragen upgrade-lake` recorded the copy. Each now refuses in one
    line naming both files, and nothing is written."""
    source, stray = forge(lake)
    before = _files(lake.root)
    why = "hold rows of the same key in table 'trajectories'"
    sql = ("sql", "SELECT count(*) FROM trajectories WHERE split = 'train'", "--data-root", lake.root)
    _refused(_cli(*sql), str(source), str(stray), why, "move the copy out of the data root")
    _refused(_cli(*sql, "--run", RUN), str(stray), why)
    _refused(_cli("export", RUN, "--out", tmp_path / "out", "--data-root", lake.root), str(stray), why)
    assert not (tmp_path / "out").exists()
    with pytest.raises(LakeError, match=str(stray)) as refused:  # retrain --from: the lake's own words
        select_trajectories(lake, "SELECT * FROM trajectories WHERE split = 'train'")
    assert not isinstance(refused.value, OfflineError)  # no query of the user's would fix it: no advice about one
    assert "it must return the columns" not in str(refused.value)
    with pytest.raises(LakeError, match=why):  # the trainer's reader
        lake.read_table("trajectories", RUN, ITERATION)
    _refused(_cli("runs", "compact", RUN, "--data-root", lake.root), str(stray), why)
    if forge is _re_encoded_records_removed:  # the upgrade would record the copy as published
        _refused(_cli("upgrade-lake", "--data-root", lake.root), str(stray), why)
        assert not (lake.root / "_commits" / RUN / "parts").exists()
    assert _files(lake.root) == before
    # the other run and the other tables still answer, with their configured counts
    assert _count(lake.root, "--run", RUNS[0]) == _configured(RUNS[0])
    assert query(lake, "SELECT count(*) AS n FROM turns").to_pylist()[0]["n"] > 0
    stray.unlink()  # the copy moved out: every row counts once again
    assert _count(lake.root) == _configured()


def test_ragen_runs_refuses_a_re_encoded_copy_of_a_table_it_reads(lake):
    (source,) = lake.partition_files("evaluations", RUNS[0], ITERATION)
    stray = source.with_name("part-copy-00000.parquet")
    pq.write_table(pq.read_table(source), stray, compression="gzip")
    _forge_entry(stray)
    _refused(_cli("runs", "--data-root", lake.root), str(source), str(stray), "same key in table 'evaluations'")
