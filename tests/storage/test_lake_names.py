"""The lake trusts no name it reads (issue 29, items 1-4 and the symlink cases of 11): compaction markers, part files
and their folders, manifests and checkpoint rows are held to the layout before anything is read or deleted. Each
attack runs against a real lake (rows written by the lake's own writers) through the real CLI; the expected counts
come from the synthetic runs' Python objects, never from the code under test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.storage import DataLake, LakeError, checkpoint_row, query
from ragen_core.storage.layout import parts_record_of
from ragen_core.storage.parts import COMPACTION_MARKER, merged_name
from tests.storage.synthetic import make_run, write_run

RUNS = {"runA": ("bandit", 0), "runB": ("sokoban", 1), "runC": ("sokoban", 2)}
PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Three runs written once through the lake API; each test attacks its own copy."""
    lake = DataLake(tmp_path_factory.mktemp("pristine") / "lake")
    runs = {
        run_id: make_run(seed, run_id, env, iterations=1, groups=2, group_size=2)
        for run_id, (env, seed) in RUNS.items()
    }
    for run in runs.values():
        write_run(lake, run)
    return lake.root, runs


@pytest.fixture()
def lake(pristine, tmp_path):
    source, runs = pristine
    shutil.copytree(source, tmp_path / "lake")
    lake = DataLake(tmp_path / "lake")
    lake.synthetic = runs
    return lake


def _cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def _one_line_error(result, *expected: str) -> None:
    """A refusal: exit status 2, nothing on stdout, one ``error:`` on stderr holding ``expected``, no traceback."""
    assert result.exit_code == 2, result.output
    assert result.stdout == "" or "this removes" in result.stdout, result.stdout
    text = " ".join(result.stderr.split())
    assert text.startswith("error:") and "Traceback" not in result.output, result.stderr
    for piece in expected:
        assert piece in text, (piece, text)


def _files(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes())
        for p in sorted(root.rglob("*"))
        if not (p.name.endswith(".lock") or p.name == "_locks")
    }


def _count(lake: DataLake, run_id: str, iteration: int | None = None) -> int:
    """Trajectories of a run (one iteration) from the synthetic objects."""
    return sum(t.iteration == iteration or iteration is None for t in lake.synthetic[run_id].trajectories)


def _sql_count(lake: DataLake, where: str, *extra: str):
    return _cli(
        "sql", f"SELECT count(*) AS n FROM trajectories WHERE {where}", "--data-root", lake.root, "-f", "json", *extra
    )


# -- 1. a compaction marker never names a file outside its folder ----------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "{victim}",
        "../../../../victim.txt",
        "part-a/../../../../../victim.txt",
        "part-x.parquet/../../../../victim.txt",
        "_COMPACTION.json",
    ],
)
def test_a_marker_naming_a_file_outside_its_folder_deletes_nothing(lake, tmp_path, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    folder = lake.partition_dir("trajectories", "runB", 0)
    replaces = [name.format(victim=victim)]
    merged = merged_name(replaces)
    shutil.copy(lake.partition_files("trajectories", "runB", 0)[0], folder / merged)  # the merged file is there
    (folder / COMPACTION_MARKER).write_text(json.dumps({"merged": merged, "replaces": replaces, "rows": 4}))
    before = _files(lake.root)

    _one_line_error(_cli("runs", "compact", "runB", "--data-root", lake.root), str(folder / COMPACTION_MARKER))
    assert victim.read_text() == "keep me" and _files(lake.root) == before
    # readers fail loudly too, naming the marker, rather than answer from a partition it describes
    _one_line_error(_sql_count(lake, "run_id = 'runB'"), COMPACTION_MARKER)
    with pytest.raises(LakeError, match=COMPACTION_MARKER):
        lake.read_table("trajectories", "runB")


def test_a_marker_that_is_a_link_is_refused(lake, tmp_path):
    folder = lake.partition_dir("trajectories", "runB", 0)
    planted = tmp_path / "marker.json"
    planted.write_text(json.dumps({"merged": "x", "replaces": []}))
    (folder / COMPACTION_MARKER).symlink_to(planted)
    before = sorted(folder.iterdir())
    assert len([p for p in before if p.name.startswith("part-")]) == 2
    _one_line_error(_cli("runs", "compact", "runB", "--data-root", lake.root), "symbolic link")
    assert sorted(folder.iterdir()) == before  # nothing compacted or deleted


# -- 2. a marker cannot hide rows ------------------------------------------------------------------------------------
def _hiding_marker(lake: DataLake, run_id: str, iteration: int, with_merged_copy: bool) -> tuple[Path, list[Path]]:
    """A marker naming the partition's part files as replaced by a 'merged' file that is a copy of the smallest."""
    folder = lake.partition_dir("trajectories", run_id, iteration)
    parts = lake.partition_files("trajectories", run_id, iteration)
    smallest = min(parts, key=lambda p: pq.read_metadata(p).num_rows)
    hidden = [p for p in parts if p != smallest]
    if with_merged_copy:  # the marker's name rules followed, the rows not
        merged = merged_name([p.name for p in hidden])
        shutil.copy(smallest, folder / merged)
        marker = {"merged": merged, "replaces": [p.name for p in hidden], "rows": pq.read_metadata(smallest).num_rows}
    else:  # the attack: an existing part file named as the merged one
        marker = {"merged": smallest.name, "replaces": [p.name for p in hidden], "rows": 8}
    (folder / COMPACTION_MARKER).write_text(json.dumps(marker))
    return folder, parts


@pytest.mark.parametrize("with_merged_copy", [False, True])
def test_a_marker_hiding_sibling_parts_fails_every_read_and_compaction_deletes_nothing(lake, with_merged_copy):
    folder, parts = _hiding_marker(lake, "runC", 0, with_merged_copy)
    marker = str(folder / COMPACTION_MARKER)
    assert sum(pq.read_metadata(p).num_rows for p in parts) == _count(lake, "runC", 0)
    for where, extra in (("run_id = 'runC' AND iteration = 0", ()), ("true", ()), ("true", ("--run", "runC"))):
        _one_line_error(_sql_count(lake, where, *extra), marker)
    _one_line_error(_cli("runs", "compact", "runC", "--data-root", lake.root), marker)
    assert all(p.is_file() for p in parts)
    # the other runs answer, with their own counts
    result = _sql_count(lake, "true", "--run", "runA")
    assert result.exit_code == 0 and json.loads(result.stdout) == [{"n": _count(lake, "runA")}]
    # once the planted marker (and its merged copy) is gone, every row is back
    (folder / COMPACTION_MARKER).unlink()
    for extra in folder.glob("part-compacted-*"):
        extra.unlink()
    result = _sql_count(lake, "run_id = 'runC' AND iteration = 0")
    assert result.exit_code == 0 and json.loads(result.stdout) == [{"n": _count(lake, "runC", 0)}]


def test_a_real_compaction_still_hides_what_it_replaced(lake):
    assert _cli("runs", "compact", "runC", "--data-root", lake.root).exit_code == 0
    result = _sql_count(lake, "run_id = 'runC'")
    assert result.exit_code == 0 and json.loads(result.stdout) == [{"n": _count(lake, "runC")}]
    assert [len(lake.partition_files("trajectories", "runC", i)) for i in (0, 1)] == [1, 1]


# -- 3. runs rm deletes only the run's own folders -------------------------------------------------------------------
@pytest.mark.parametrize(
    "target",
    [
        "{root}/trajectories/run_id=runA",
        "{root}/runs/runA/checkpoints/iteration=0",
        "{root}/runs/runC/checkpoints/iteration=0/../../../runA",
        "{root}",
        "{root}/runs",
        "/tmp",
        "relative/runs/runC/checkpoints/iteration=0",
    ],
)
def test_runs_rm_never_follows_a_checkpoint_row_out_of_the_run(lake, target):
    path = target.format(root=lake.root)
    lake.write_rows("checkpoints", "runC", 1, [checkpoint_row("runC", 1, path, "hf", {})], stage="commit")
    (checkpoint_file,) = lake.partition_files("checkpoints", "runC", 1)
    before = _files(lake.root)

    result = _cli("runs", "rm", "runC", "--yes", "--data-root", lake.root)
    _one_line_error(result, str(checkpoint_file), "runs/runC/checkpoints/iteration=<n>")
    assert _files(lake.root) == before  # nothing deleted, the manifest not even marked 'deleting'
    assert lake.read_manifest("runC").status == "completed"
    assert lake.read_table("trajectories", "runA").num_rows == _count(lake, "runA")


def test_runs_rm_removes_the_run_with_its_checkpoints_and_keeps_the_others(lake):
    own = lake.checkpoint_dir("runC", 1)
    (own / "hf").mkdir(parents=True)
    rows = [checkpoint_row("runC", 1, str(own), "deepspeed", {}), checkpoint_row("runC", 1, str(own / "hf"), "hf", {})]
    lake.write_rows("checkpoints", "runC", 1, rows, stage="commit")
    result = _cli("runs", "rm", "runC", "--yes", "--data-root", lake.root)
    assert result.exit_code == 0, result.output
    assert not lake.run_dir("runC").exists() and not list(lake.root.rglob("*runC*"))
    assert {r: lake.read_table("trajectories", r).num_rows for r in ("runA", "runB")} == {
        r: _count(lake, r) for r in ("runA", "runB")
    }


# -- 4. rows belong to the run and iteration of their folder ---------------------------------------------------------
def _move_part(lake: DataLake, source: tuple[str, int], target: tuple[str, int], name: str) -> Path:
    """Move a part file written by the lake for ``source`` (run, iteration) into ``target``'s folder."""
    part = lake.partition_files("trajectories", *source)[0]
    moved = lake.partition_dir("trajectories", *target) / name
    os.replace(part, moved)
    return moved


@pytest.mark.parametrize("source", [("runB", 0), ("runA", 1)])
def test_a_part_file_in_another_runs_or_iterations_folder_fails_loudly(lake, source):
    moved = _move_part(lake, source, ("runA", 0), "part-planted-00000.parquet")
    column = "run_id" if source[0] != "runA" else "iteration"
    for where, extra in (("run_id = 'runB'", ()), ("true", ("--run", "runA")), ("iteration = 1", ())):
        _one_line_error(_sql_count(lake, where, *extra), str(moved), f"holds rows with {column}")
    with pytest.raises(LakeError, match="rows belong to the run and iteration of their folder"):
        lake.read_table("trajectories", "runA")
    _one_line_error(_cli("runs", "compact", "runA", "--data-root", lake.root), str(moved))
    assert moved.is_file()
    # runC, untouched, still answers with its own count
    result = _sql_count(lake, "true", "--run", "runC")
    assert result.exit_code == 0 and json.loads(result.stdout) == [{"n": _count(lake, "runC")}]


def _rewrite(path: Path, change) -> None:
    table = pq.read_table(path)
    pq.write_table(change(table).replace_schema_metadata(table.schema.metadata), path)


def test_a_part_file_missing_a_not_null_column_fails_instead_of_reading_nulls(lake):
    path = lake.partition_files("trajectories", "runB", 0)[0]
    _rewrite(path, lambda t: t.drop_columns(["success"]))
    _one_line_error(_sql_count(lake, "success IS NULL"), str(path), "lacks the NOT NULL column(s) ['success']")
    with pytest.raises(LakeError, match="success"):
        lake.read_table("trajectories", "runB")


def test_a_footer_checked_once_is_checked_again_when_its_file_changes(lake, monkeypatch):
    """A process keeps the footers it checked (a viewer, a sweep query the same files again and again); a part file
    rewritten since, even with its old modification time put back, is read and refused again."""
    from ragen_core.storage import catalog

    reads: list[Path] = []
    monkeypatch.setattr(catalog, "footer", lambda path: reads.append(path) or pq.read_metadata(path))
    result = _sql_count(lake, "run_id = 'runB'")
    assert result.exit_code == 0 and json.loads(result.stdout) == [{"n": _count(lake, "runB")}]
    parquet = sorted((lake.root / "trajectories").rglob("*.parquet"))
    assert parquet and sorted(reads) == parquet  # every part file of the table the query names, once
    again = _sql_count(lake, "run_id = 'runB'")
    assert again.stdout == result.stdout and len(reads) == len(parquet)  # none read twice
    path = lake.partition_files("trajectories", "runB", 0)[0]
    before = path.stat()
    _rewrite(path, lambda t: t.drop_columns(["success"]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    record = parts_record_of(path.parent)  # and the partition's record vouches for its new size
    payload = json.loads(record.read_text())
    payload["parts"][path.name] = path.stat().st_size
    record.write_text(json.dumps(payload))
    _one_line_error(_sql_count(lake, "true"), str(path), "lacks the NOT NULL column(s) ['success']")
    assert reads[len(parquet) :] == [path]  # the changed file alone is read again


def test_nulls_in_a_not_null_column_fail_too(lake):
    path = lake.partition_files("trajectories", "runB", 0)[0]

    def null_env(table: pa.Table) -> pa.Table:
        index = table.schema.get_field_index("env")
        field = table.schema.field(index).with_nullable(True)
        return table.set_column(index, field, pa.nulls(table.num_rows, pa.string()))

    _rewrite(path, null_env)
    _one_line_error(_sql_count(lake, "env IS NULL"), str(path), "nulls in the NOT NULL column 'env'")
    with pytest.raises(LakeError, match="'env'"):
        lake.read_table("trajectories", "runB")


def test_a_manifest_naming_another_run_is_broken_and_hides_nothing(lake):
    path = lake.run_dir("runA") / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "run_id": "runB"}))
    result = _cli("runs", "--data-root", lake.root, "-f", "json")
    assert result.exit_code == 1, result.output
    rows = json.loads(result.stdout)
    assert sorted(r["run_id"] for r in rows) == ["runA", "runB", "runC"]  # runB once, runA still listed
    assert {r["run_id"]: r["status"] for r in rows}["runA"] == "broken"
    assert str(path) in " ".join(result.stderr.split()) and "says run_id 'runB'" in result.stderr
    _one_line_error(_cli("sql", "SELECT count(*) FROM runs", "--data-root", lake.root), str(path))
    _one_line_error(_cli("runs", "rm", "runA", "--yes", "--data-root", lake.root), str(path))
    assert lake.read_manifest("runB").run_id == "runB"
    assert lake.read_table("trajectories", "runA").num_rows == _count(lake, "runA")


# -- 11. links: no rows from outside the root, no housekeeping through a link ----------------------------------------
def test_a_symlinked_part_file_reads_no_rows_from_outside_the_root(lake, tmp_path):
    outside = tmp_path / "outside.parquet"
    shutil.copy(lake.partition_files("trajectories", "runA", 0)[0], outside)
    link = lake.partition_dir("trajectories", "runA", 0) / "part-linked-00000.parquet"
    link.symlink_to(outside)
    _one_line_error(_sql_count(lake, "true"), str(link), "symbolic link")
    with pytest.raises(LakeError, match="symbolic link"):
        query(lake, "SELECT count(*) FROM trajectories")
    result = _cli("sql", "SELECT count(*) AS n FROM metrics", "--data-root", lake.root, "-f", "json")
    assert result.exit_code == 0  # the other tables answer
    assert outside.is_file()


@pytest.mark.parametrize("level", ["run", "iteration"])
def test_a_symlinked_partition_folder_is_refused_by_compact_and_rm_without_a_stuck_run(lake, tmp_path, level):
    run_folder = lake.run_partition_dir("trajectories", "runB")
    folder = run_folder if level == "run" else lake.partition_dir("trajectories", "runB", 0)
    outside = tmp_path / "elsewhere"
    shutil.move(folder, outside)
    folder.symlink_to(outside, target_is_directory=True)
    before = {str(p.relative_to(outside)) for p in outside.rglob("*")}

    _one_line_error(_cli("runs", "compact", "runB", "--data-root", lake.root), str(folder), "symbolic link")
    _one_line_error(_cli("runs", "rm", "runB", "--yes", "--data-root", lake.root), str(folder), "symbolic link")
    assert lake.read_manifest("runB").status == "completed"  # never left 'deleting'
    assert {str(p.relative_to(outside)) for p in outside.rglob("*")} == before and folder.is_symlink()
    _one_line_error(_sql_count(lake, "true"), str(folder))
    # the link taken away by hand (as the message says), the run is removed
    folder.unlink()
    assert _cli("runs", "rm", "runB", "--yes", "--data-root", lake.root).exit_code == 0
    assert not lake.run_dir("runB").exists() and sorted(before) == sorted(
        str(p.relative_to(outside)) for p in outside.rglob("*")
    )


# -- 11. a read-only data root: one line, the run not left 'deleting' ------------------------------------------------
def _on_read_only_root(root: Path, args: list[str]) -> subprocess.CompletedProcess:
    """The real ``ragen`` in a subprocess that sees ``root`` read-only: a read-only bind mount in a private mount
    namespace as root (root ignores folder permissions), folder permissions otherwise."""
    command = [sys.executable, "-m", "ragen_cli.main", *args]
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    if os.geteuid() != 0:
        for path in [root, *root.rglob("*")]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            return subprocess.run(command, capture_output=True, text=True, env=env, cwd=PROJECT, timeout=120)
        finally:
            for path in [root, *root.rglob("*")]:
                path.chmod(0o755 if path.is_dir() else 0o644)
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare to mount the data root read-only as root")
    script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, str(root), *command],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT,
        timeout=120,
    )
    if "mount" in result.stderr and "Traceback" not in result.stderr and "error:" not in result.stderr:
        pytest.skip(f"cannot mount read-only here: {result.stderr.strip()}")
    return result


@pytest.mark.process  # the real ragen in a subprocess
@pytest.mark.parametrize("command", ["rm", "compact"])
def test_rm_and_compact_on_a_read_only_root_fail_in_one_line(lake, command):
    before = _files(lake.root)
    extra = ["--yes"] if command == "rm" else []
    result = _on_read_only_root(lake.root, ["runs", command, "runB", *extra, "--data-root", str(lake.root)])
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error:") and "runB" in result.stderr and "only" in result.stderr
    assert _files(lake.root) == before and lake.read_manifest("runB").status == "completed"


# -- 11. resume of a manifest of the wrong shape: one line naming it, nothing started --------------------------------
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"config": "not a mapping"}, "has config = 'not a mapping', not a mapping"),
        ({"config": [1, 2]}, "has config = [1, 2], not a mapping"),
        ({"resumes": "twice"}, "has resumes = 'twice', not a list"),
        ({"last_committed_iteration": "3"}, "has last_committed_iteration = '3', not an integer"),
        ({"last_committed_iteration": True}, "not an integer"),
        ({"status": 5}, "has status = 5, not a text"),
        ({"model_dir": {"a": 1}}, "has model_dir = {'a': 1}, not a text"),
        ({"config": {}}, "holds no config to resume with"),
        ({"config": {"trainer": "fast"}}, "trainer"),
        (None, "is not a JSON object"),
    ],
)
def test_resume_of_a_manifest_of_the_wrong_shape_is_one_line(lake, change, expected):
    path = lake.run_dir("runB") / "manifest.json"
    stored = json.loads(path.read_text())
    path.write_text(json.dumps([stored] if change is None else {**stored, **change}))
    before = _files(lake.root)
    result = _cli("resume", "runB", "--data-root", lake.root)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stderr.startswith("error:")
    assert expected in " ".join(result.stderr.split())
    if change is None or not isinstance(change.get("config"), dict):
        assert str(path) in " ".join(result.stderr.split()) or "runB" in result.stderr
    assert _files(lake.root) == before and not (lake.root / "_prefect").exists()


def test_the_lake_never_publishes_through_a_linked_partition_folder(lake, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    folder = lake.partition_dir("metrics", "runA", 7)
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.symlink_to(outside, target_is_directory=True)
    row = {"run_id": "runA", "iteration": 7, "name": "x", "value": 1.0}
    with pytest.raises(LakeError, match="symbolic link"):
        lake.write_rows("metrics", "runA", 7, [row], stage="commit")
    assert list(outside.iterdir()) == []
