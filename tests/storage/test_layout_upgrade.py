"""Upgrading a data root of lake layout 1 (``run_id=<id>/iteration=<n>/part-<stage>-<k>.parquet``,
``_COMPACTION.json``): readers refuse it naming the upgrade; `ragen upgrade-lake` brings it to the current layout
with every row once; an upgrade interrupted at any step goes on where it stopped when run again.

The layout-1 lake is the real lake of :mod:`tests.storage.real_lake` renamed back by :func:`to_layout_1`, the old
naming kept for these tests (stage names, compaction markers and merged-file names as the old code wrote them)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.storage import DataLake, LakeError, Stage, query
from ragen_core.storage.layout import stage_token
from ragen_core.storage.maintenance import compact_run
from ragen_core.storage.maintenance import upgrade as upgrade_module
from ragen_core.storage.maintenance.upgrade import upgrade_layout
from ragen_core.storage.parts import merged_name
from schemas.tables import TABLES
from tests.storage.real_lake import RUNS, VAL_ENVS, expected_counts, make_real_lake

PARQUET_TABLES = sorted(name for name, spec in TABLES.items() if spec.source == "parquet")
LAYOUT_2 = {"layout_version": 2, "part_records": True}
STAGES = [Stage.ROLLOUT, Stage.COMMIT, Stage.DEMOS, Stage.SKIP, *(Stage.evaluation(env) for env in VAL_ENVS)]


@pytest.fixture(scope="module")
def new_lake(prefect_harness, tmp_path_factory, tiny_model_dir) -> Path:
    return make_real_lake(tmp_path_factory.mktemp("layout2"), tiny_model_dir)


@pytest.fixture(scope="module")
def original(new_lake) -> dict[str, list[dict]]:
    """Every table's rows as the Python reader gives them on the lake as written (sorted, comparable)."""
    return {table: _rows(new_lake, table) for table in PARQUET_TABLES}


def _rows(root: Path, table: str) -> list[str]:
    rows = DataLake(root).read_table(table).to_pylist()
    return sorted(json.dumps(row, sort_keys=True, default=repr) for row in rows)


def _old_part_name(name: str) -> str:
    """The layout-1 name of a published part file (the stage found from its token)."""
    token, _, number = name.removeprefix("part-").removesuffix(".parquet").partition("-")
    stage = next(s for s in STAGES if stage_token(s) == token)
    return f"part-{stage}-{number}.parquet"


def to_layout_1(root: Path) -> Path:
    """Rename a layout-2 data root's table folders, part files and compaction markers as layout 1 had them."""
    (root / "_layout.json").unlink()
    for records in root.glob("_commits/*/parts"):  # layout 1 kept no record of published parts
        shutil.rmtree(records)
    for table in PARQUET_TABLES:
        for run_folder in sorted((root / table).glob("run-*")):
            for folder in sorted(run_folder.glob("iteration-*")):
                _partition_to_layout_1(folder)
                folder.rename(run_folder / folder.name.replace("iteration-", "iteration="))
            run_folder.rename(run_folder.with_name("run_id=" + run_folder.name.removeprefix("run-")))
    return root


def _partition_to_layout_1(folder: Path) -> None:
    marker_path = folder / ".compaction.json"
    marker = json.loads(marker_path.read_text()) if marker_path.is_file() else None
    for path in sorted(folder.glob("part-*.parquet")):
        if marker is None or path.name != marker["merged"]:
            path.rename(folder / _old_part_name(path.name))
    if marker is not None:
        replaces = [_old_part_name(n) for n in marker["replaces"]]
        (folder / marker["merged"]).rename(folder / merged_name(replaces))
        (folder / "_COMPACTION.json").write_text(
            json.dumps({**marker, "merged": merged_name(replaces), "replaces": replaces})
        )
        marker_path.unlink()


@pytest.fixture
def old_lake(new_lake, tmp_path) -> Path:
    return to_layout_1(Path(shutil.copytree(new_lake, tmp_path / "old")))


def _assert_same_rows(root: Path, original: dict[str, list[str]], new_lake: Path) -> None:
    for table in PARQUET_TABLES:
        assert _rows(root, table) == original[table], table
    assert expected_counts(root, "trajectories") == expected_counts(new_lake, "trajectories")
    assert not list(root.glob("*/run_id=*")) and not list(root.glob("*/*/.upgrading-*"))
    assert json.loads((root / "_layout.json").read_text()) == LAYOUT_2


def test_the_old_layout_is_written_as_the_old_code_wrote_it(old_lake):
    names = {p.name for p in (old_lake / "trajectories" / f"run_id={RUNS[1]}" / "iteration=0").iterdir()}
    assert names == {"part-rollout-00000.parquet", *(f"part-eval-{env}-00000.parquet" for env in VAL_ENVS)}
    assert list((old_lake / "trajectories" / f"run_id={RUNS[0]}").glob("*/_COMPACTION.json"))


def test_readers_refuse_the_old_layout_naming_the_upgrade(old_lake):
    with pytest.raises(LakeError) as refused:
        DataLake(old_lake).read_table("trajectories")
    said = str(refused.value)  # the folder named inside the data root, the command to run with the root itself
    assert said.startswith(f"data root {str(old_lake)!r} has tables in the old lake layout 1 ('trajectories/"), said
    assert f"`ragen upgrade-lake --data-root {old_lake}`" in said
    result = CliRunner().invoke(app, ["sql", "SELECT count(*) FROM trajectories", "--data-root", str(old_lake)])
    assert result.exit_code != 0 and "ragen upgrade-lake" in result.output and "Traceback" not in result.output


def test_upgrade_lake_keeps_every_row_once(old_lake, original, new_lake):
    result = CliRunner().invoke(app, ["upgrade-lake", "--data-root", str(old_lake)])
    assert result.exit_code == 0, result.output
    partitions = sum(1 for table in PARQUET_TABLES for _ in new_lake.glob(f"{table}/run-*/iteration-*"))
    assert f"{partitions} partition(s)" in result.output
    _assert_same_rows(old_lake, original, new_lake)
    # the compacted run: its merged files and markers under their new names, so compaction goes on from there
    assert compact_run(DataLake(old_lake), RUNS[0]).compacted == []
    again = CliRunner().invoke(app, ["upgrade-lake", "--data-root", str(old_lake)])
    assert again.exit_code == 0 and "already has lake layout 2" in again.output


def test_upgrade_lake_refuses_a_layout_1_partition_holding_a_re_encoded_copy(old_lake):
    """Issue 66: the upgrade records every part it moves as published; a copy in other bytes (the rows of a part,
    written again gzip-compressed under the next part number) is refused before anything changes, naming both."""
    folder = old_lake / "trajectories" / f"run_id={RUNS[1]}" / "iteration=1"
    source, stray = folder / "part-rollout-00000.parquet", folder / "part-rollout-00001.parquet"
    pq.write_table(pq.read_table(source), stray, compression="gzip")
    before = sorted(str(p.relative_to(old_lake)) for p in old_lake.rglob("*"))
    result = CliRunner().invoke(app, ["upgrade-lake", "--data-root", str(old_lake)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    message = " ".join(result.stderr.split())
    assert str(source) in message and str(stray) in message and "rows of the same key" in message
    assert sorted(str(p.relative_to(old_lake)) for p in old_lake.rglob("*")) == before  # nothing changed


class Crash(Exception):
    pass


def _crash_on(calls: int, real):
    """A stand-in for ``real`` that raises on its ``calls``-th call (earlier calls do the real thing)."""
    seen = {"n": 0}

    def wrapper(*args):
        seen["n"] += 1
        if seen["n"] == calls:
            raise Crash(f"crash at call {calls}")
        return real(*args)

    return wrapper


def _remove_half_then_crash(calls: int):
    """Step 3 stopped half-way on its ``calls``-th partition: some old files deleted, not all."""
    seen = {"n": 0}
    real = upgrade_module._remove_old_partition

    def wrapper(old: Path) -> None:
        seen["n"] += 1
        if seen["n"] != calls:
            return real(old)
        files = sorted(old.iterdir(), key=lambda e: e.name == "_COMPACTION.json")
        for entry in files[: max(1, len(files) // 2)]:
            entry.unlink()
        raise Crash("crash in the middle of step 3")

    return wrapper


@pytest.mark.parametrize(
    "step, calls",
    [
        ("fill", 1),
        ("fill", 9),
        ("commit", 1),
        ("commit", 14),
        ("remove", 2),
        ("remove", 20),
        ("remove_half", 1),
        ("remove_half", 7),
    ],
)
def test_an_interrupted_upgrade_goes_on_where_it_stopped(old_lake, original, new_lake, monkeypatch, step, calls):
    fault = {
        "fill": lambda: ("_second_name", _crash_on(calls, upgrade_module._second_name)),
        "commit": lambda: ("_commit_partition", _crash_on(calls, upgrade_module._commit_partition)),
        "remove": lambda: ("_remove_old_partition", _crash_on(calls, upgrade_module._remove_old_partition)),
        "remove_half": lambda: ("_remove_old_partition", _remove_half_then_crash(calls)),
    }[step]()
    with monkeypatch.context() as patched:
        patched.setattr(upgrade_module, *fault)
        with pytest.raises(Crash):
            upgrade_layout(DataLake(old_lake))
    with pytest.raises(LakeError, match="ragen upgrade-lake"):  # half-way: still refused, never read in part
        query(old_lake, "SELECT count(*) FROM trajectories")
    report = upgrade_layout(DataLake(old_lake))
    assert report.partitions
    _assert_same_rows(old_lake, original, new_lake)


def test_a_compaction_stopped_after_its_commit_point_in_layout_1_is_finished_after_the_upgrade(
    old_lake, original, new_lake
):
    # layout 1 as a compaction that crashed after its rename left it: the merged file, its marker and the replaced
    # files all present (readers skip the replaced ones)
    folder = old_lake / "trajectories" / f"run_id={RUNS[1]}" / "iteration=1"
    parts = sorted(folder.glob("part-*.parquet"))
    merged = merged_name([p.name for p in parts])
    table = pa.concat_tables([pq.read_table(p) for p in parts])
    pq.write_table(table.replace_schema_metadata(pq.read_schema(parts[0]).metadata), folder / merged)
    (folder / "_COMPACTION.json").write_text(
        json.dumps({"merged": merged, "replaces": [p.name for p in parts], "rows": table.num_rows})
    )
    upgrade_layout(DataLake(old_lake))
    _assert_same_rows(old_lake, original, new_lake)  # the replaced files are hidden by the translated marker
    new_folder = old_lake / "trajectories" / f"run-{RUNS[1]}" / "iteration-1"
    assert len(list(new_folder.glob("part-*.parquet"))) == len(parts) + 1
    compact_run(DataLake(old_lake), RUNS[1])  # its recovery finishes the layout-1 compaction
    assert [p.name.startswith("part-compacted-") for p in new_folder.glob("part-*.parquet")] == [True]
    _assert_same_rows(old_lake, original, new_lake)


def _metrics(run_id: str, iteration: int) -> list[dict]:
    return [{"run_id": run_id, "iteration": iteration, "name": "m", "value": 1.0}]


def test_a_new_data_root_records_its_layout_and_a_newer_one_is_refused(tmp_path):
    lake = DataLake(tmp_path)
    assert not (tmp_path / "_layout.json").exists()
    lake.write_rows("metrics", "a", 0, _metrics("a", 0), stage="commit")
    assert json.loads((tmp_path / "_layout.json").read_text()) == LAYOUT_2
    (tmp_path / "_layout.json").write_text(json.dumps({"layout_version": 3}))
    for call in (
        lambda: lake.read_table("metrics"),
        lambda: upgrade_layout(lake),
        lambda: lake.write_rows("metrics", "a", 1, _metrics("a", 1), stage="commit"),
    ):
        with pytest.raises(LakeError, match="has lake layout 3, but this ragen-flows only knows layouts up to 2"):
            call()
    assert json.loads((tmp_path / "_layout.json").read_text()) == {"layout_version": 3}


def test_a_damaged_layout_file_names_the_text_that_keeps_the_records_on(tmp_path):
    """Issue 66: the advice used to be ``{"layout_version": 2}``, which turns the records of published parts off (a
    partition without one was then read whole, copies included). The text it names now is what a data root of this
    layout records; written back, a partition whose record is gone stays refused."""
    lake = DataLake(tmp_path)
    lake.write_rows("metrics", "a", 0, _metrics("a", 0), stage="commit")
    (tmp_path / "_layout.json").write_text(json.dumps({"layout": 2}))
    with pytest.raises(LakeError, match="no integer layout_version") as refused:
        lake.read_table("metrics")
    suggested = re.search(r"write (\{.*?\}) into it", str(refused.value)).group(1)
    assert json.loads(suggested) == LAYOUT_2
    assert "ragen upgrade-lake" in str(refused.value)
    (tmp_path / "_layout.json").write_text(suggested)
    assert lake.read_table("metrics").num_rows == 1
    (record,) = (tmp_path / "_commits" / "a" / "parts" / "metrics").iterdir()
    record.unlink()  # the records deleted, as in the issue: the partition is refused, not read whole
    with pytest.raises(LakeError, match="without a record of the parts the lake published there"):
        lake.read_table("metrics")


def test_a_run_with_layout_1_folders_is_not_published_into(tmp_path):
    lake = DataLake(tmp_path)
    lake.write_rows("metrics", "a", 0, _metrics("a", 0), stage="commit")
    old = tmp_path / "turns" / "run_id=a"
    old.mkdir(parents=True)
    with pytest.raises(LakeError, match=r"old lake layout 1 .*ragen upgrade-lake"):
        lake.write_rows("metrics", "a", 1, _metrics("a", 1), stage="commit")
    assert [p.parent.name for p in lake.partition_files("metrics")] == ["iteration-0"]  # nothing published
    lake.write_rows("metrics", "b", 0, _metrics("b", 0), stage="commit")  # another run is written as usual


# -- every name is checked before the first change (issue 39, item 5) ------------------------------------------------
def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.name != "_locks" and not p.name.endswith(".lock")
    }


def _hidden_folder(partition: Path) -> Path:
    (partition / ".notes").mkdir()
    (partition / ".notes" / "todo.txt").write_text("look at this run again")
    return partition / ".notes"


def _odd_part_name(partition: Path) -> Path:
    source = next(partition.glob("part-*.parquet"))
    shutil.copy(source, partition / "part-a b.parquet")
    return partition / "part-a b.parquet"


def _plain_folder(partition: Path) -> Path:
    (partition / "extra").mkdir()
    return partition / "extra"


def _link(partition: Path) -> Path:
    (partition / "part-linked-00000.parquet").symlink_to(next(partition.glob("part-*.parquet")))
    return partition / "part-linked-00000.parquet"


@pytest.mark.parametrize(
    "plant",
    [_hidden_folder, _odd_part_name, _plain_folder, _link],
    ids=["hidden folder", "odd part name", "folder", "link"],
)
def test_an_entry_the_upgrade_cannot_carry_over_is_refused_before_anything_changes(
    old_lake, original, new_lake, tmp_path, plant
):
    # in the last partition the upgrade reaches: without the check up front, every other one would be moved first
    partition = old_lake / "turns" / f"run_id={RUNS[1]}" / "iteration=2"
    planted = plant(partition)
    before = _tree(old_lake)
    for _ in range(2):  # refused the same way when run again: never stuck half-way
        result = CliRunner().invoke(app, ["upgrade-lake", "--data-root", str(old_lake)])
        assert result.exit_code == 2, result.output
        assert result.stdout == "" and "Traceback" not in result.output
        assert result.stderr.startswith("error:") and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert str(planted) in " ".join(result.stderr.split()) and "nothing was changed" in result.stderr
        assert _tree(old_lake) == before
    # moved out of the data root, the upgrade goes through with every row once
    shutil.move(planted, tmp_path / "moved")
    result = CliRunner().invoke(app, ["upgrade-lake", "--data-root", str(old_lake)])
    assert result.exit_code == 0, result.output
    _assert_same_rows(old_lake, original, new_lake)


def _copy_rows(url: str, cache: Path, monkeypatch) -> dict[str, list[str]]:
    """Every table's rows as a host whose local copies lie in ``cache`` reads the bucket (its copy brought up to
    date first)."""
    from ragen_core.storage.storecopy import open_store_root

    monkeypatch.setenv("RAGEN_OBJECT_CACHE", str(cache))
    copy = open_store_root(url)
    return {table: _rows(copy, table) for table in PARQUET_TABLES}


def test_upgrade_lake_on_a_bucket_moves_every_object_and_goes_on_where_it_stopped(
    old_lake, original, new_lake, s3_root, monkeypatch, tmp_path
):
    from ragen_core.storage.objectstore import Store

    url, server = s3_root
    bucket, client = url.split("/")[2], server.client()
    for path in sorted(p for p in old_lake.rglob("*") if p.is_file()):  # `aws s3 sync` of the old data root
        client.upload_file(str(path), bucket, f"lake/{path.relative_to(old_lake).as_posix()}")
    old_keys = {k for k in server.objects(bucket) if "/run_id=" in k}
    assert old_keys
    with pytest.raises(LakeError) as refused:  # another host, before: refused, naming the upgrade of the bucket
        _copy_rows(url, tmp_path / "host-b", monkeypatch)
    assert str(refused.value).startswith(f"data root {url!r} has tables in the old lake layout 1 ('"), refused.value
    assert str(refused.value).endswith(f"`ragen upgrade-lake --data-root {url}` (safe to interrupt and run again)")
    cache_a = str(tmp_path / "host-a")
    monkeypatch.setenv("RAGEN_OBJECT_CACHE", cache_a)

    # killed after the copy moved the first run's files, before any reached the bucket
    with monkeypatch.context() as patched:
        patched.setattr(DataLake, "publish_rewrite", lambda *a, **k: (_ for _ in ()).throw(LakeError("killed")))
        result = CliRunner().invoke(app, ["upgrade-lake", "--data-root", url])
    assert result.exit_code == 2 and "killed" in result.output, result.output
    assert {k for k in server.objects(bucket) if "/run_id=" in k} == old_keys
    assert not any("/run-" in k for k in server.objects(bucket) if not k.startswith("lake/_"))
    # killed again, once every run's new names are in the bucket, half-way through deleting the old ones
    removals, remove = [], Store.remove

    def remove_then_die(self, relative, etag=None):
        if "/run_id=" in relative:
            if len(removals) == len(old_keys) // 2:
                raise LakeError("killed")
            removals.append(relative)
        return remove(self, relative, etag)

    with monkeypatch.context() as patched:
        patched.setattr(Store, "remove", remove_then_die)
        result = CliRunner().invoke(app, ["upgrade-lake", "--data-root", url])
    assert result.exit_code == 2 and "killed" in result.output, result.output
    left = {k for k in server.objects(bucket) if "/run_id=" in k}
    assert left and left < old_keys
    assert {k for k in old_keys if k.endswith("/_COMPACTION.json")} <= left  # a partition's marker after its parts
    with pytest.raises(LakeError, match="ragen upgrade-lake"):  # both layouts there: still refused, never half read
        _copy_rows(url, tmp_path / "host-b", monkeypatch)

    monkeypatch.setenv("RAGEN_OBJECT_CACHE", cache_a)
    result = CliRunner().invoke(app, ["upgrade-lake", "--data-root", url])
    assert result.exit_code == 0, result.output
    assert f"upgraded {url}" in result.output or f"{url} already has lake layout" in result.output
    objects = server.objects(bucket)
    assert not [k for k in objects if "/run_id=" in k] and not [k for k in objects if k.startswith("lake/_uploads/")]
    assert json.loads(objects["lake/_layout.json"]) == LAYOUT_2
    expected_parts = {  # every published part of the layout-2 lake the old one was made from, under its own name
        f"lake/{p.relative_to(new_lake).as_posix()}" for p in new_lake.glob("*/run-*/iteration-*/part-*.parquet")
    }
    assert {k for k in objects if k.endswith(".parquet") and "/run-" in k} == expected_parts
    # the host that read the old layout, a fresh one and the upgrader: every row once, as the lake was written
    for cache in ("host-b", "host-c", "host-a"):
        assert _copy_rows(url, tmp_path / cache, monkeypatch) == original, cache
    assert not list((tmp_path / "host-b").rglob("run_id=*"))
