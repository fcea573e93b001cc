"""The lake trusts no name it reads, at every level (issue 29, the attacks of the same classes beyond its list): the
folders a run's writers fill and clear (staging, commits, quarantine, checkpoints, the run's folder), the lock files a
command truncates, the JSON files it parses, and the merged file a compaction marker names. Each attack is planted in
a real lake (rows written by the lake's own writers) and the real command is run; what must survive is compared
byte for byte with what was there before."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragen_core.storage import DataLake, LakeError, Stage
from ragen_core.storage.files import MAX_JSON_BYTES
from ragen_core.storage.layout import published_part_name
from ragen_core.storage.parts import COMPACTION_MARKER, merged_name, record_parts
from tests.flows.test_concurrency import _train
from tests.storage import test_lake_names as lake_names
from tests.storage.test_lake_names import _cli, _files, _one_line_error, _sql_count

# the three-run lake of the layout tests, each test attacking its own copy
pristine, lake = lake_names.pristine, lake_names.lake


def _victim_file(tmp_path: Path) -> tuple[Path, bytes]:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious bytes outside the data root\n")
    return victim, victim.read_bytes()


def _victim_tree(tmp_path: Path) -> tuple[Path, dict[str, bytes | None]]:
    """A folder outside the data root shaped like the lake's own (iteration and stage folders), so that any code
    following a link into it would find something to clear."""
    victim = tmp_path / "victim"
    for relative in ("0/rollout/_DONE.json", "1/commit/part.txt", "7/keep.txt", "iteration=1/checkpoint.json"):
        (victim / relative).parent.mkdir(parents=True, exist_ok=True)
        (victim / relative).write_text("keep me")
    return victim, _files(victim)


# -- lock files: taking a lock truncates and writes its file, never through a link -----------------------------------
@pytest.mark.parametrize("command", [["runs", "rm", "runA", "--yes"], ["resume", "runA"]])
def test_a_writer_lock_that_is_a_link_is_refused_and_its_target_kept(lake, tmp_path, command):
    victim, content = _victim_file(tmp_path)
    lock = lake.run_dir("runA") / "writer.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(victim)
    before = _files(lake.root)
    _one_line_error(_cli(*command, "--data-root", lake.root), str(lock), "symbolic link")
    assert victim.read_bytes() == content  # once truncated to hold the lock's holder record
    assert _files(lake.root) == before and lake.read_manifest("runA").status == "completed"


@pytest.mark.parametrize("target_exists", [True, False])
def test_a_housekeeping_lock_that_is_a_link_is_refused(lake, tmp_path, target_exists):
    victim, content = _victim_file(tmp_path)
    if not target_exists:
        victim.unlink()
    (lake.root / "_locks").mkdir(exist_ok=True)
    (lake.root / "_locks" / "runB.lock").symlink_to(victim)
    before = _files(lake.root)
    _one_line_error(_cli("runs", "compact", "runB", "--data-root", lake.root), "runB.lock", "symbolic link")
    assert (victim.read_bytes() == content) if target_exists else not victim.exists()  # not even created
    assert _files(lake.root) == before


def test_a_linked_run_folder_takes_no_lock_and_no_write(lake, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.move(lake.run_dir("runA"), outside)
    (lake.root / "runs" / "runA").symlink_to(outside, target_is_directory=True)
    before = _files(outside)
    _one_line_error(_cli("resume", "runA", "--data-root", lake.root), "runA", "symbolic link")
    assert _files(outside) == before


# -- a run's staging, commits and checkpoints: never written or cleared through a link -------------------------------
def test_ragen_train_never_clears_a_linked_staging_folder(prefect_harness, tmp_path, tiny_model_dir):
    """The attack as found: `_staging/<run>` a link to a folder with numbered subfolders; a real `ragen train` of
    that run used to delete them (each committed iteration's staging is removed). The command talks to the
    session's Prefect server (the attack is on the lake, not on Prefect): no temporary server of its own to start."""
    from prefect.settings import PREFECT_API_URL

    root = tmp_path / "lake"
    (root / "_staging").mkdir(parents=True)
    victim, before = _victim_tree(tmp_path)
    (root / "_staging" / "runZ").symlink_to(victim, target_is_directory=True)
    output, _ = _train(root, "runZ", tiny_model_dir, api_url=PREFECT_API_URL.value()).communicate(timeout=400)
    assert _files(victim) == before, output[-3000:]
    assert "_staging/runZ' is a symbolic link" in output and "Traceback" not in output, output[-3000:]


@pytest.mark.parametrize("level", ["run", "iteration", "stage"])
def test_a_redo_never_clears_a_linked_staging_folder(lake, tmp_path, level):
    """What `ragen resume` of an interrupted iteration does first (discard what it will redo), with the link at each
    level of the staging tree."""
    victim, before = _victim_tree(tmp_path)
    staging = lake.root / "_staging" / "runA"
    shutil.rmtree(staging, ignore_errors=True)
    if level == "run":
        staging.parent.mkdir(parents=True, exist_ok=True)
        staging.symlink_to(victim, target_is_directory=True)
    elif level == "iteration":
        staging.mkdir(parents=True)
        (staging / "7").symlink_to(victim / "7", target_is_directory=True)
    else:  # a finished stage of the iteration redone: its files are kept, the rest of its folder cleared
        (staging / "7").mkdir(parents=True)
        (staging / "7" / "rollout").symlink_to(victim / "0" / "rollout", target_is_directory=True)
    with pytest.raises(LakeError, match="symbolic link"):
        lake.discard_uncommitted("runA", 7)
    assert _files(victim) == before


def test_checkpoints_are_never_pruned_through_a_link(lake, tmp_path):
    victim, before = _victim_tree(tmp_path)
    folder = lake.checkpoints_dir("runA")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "iteration=1").symlink_to(victim / "iteration=1", target_is_directory=True)
    for newer in (2, 3):
        (folder / f"iteration={newer}").mkdir()
        (folder / f"iteration={newer}" / "checkpoint.json").write_text("{}")
    with pytest.raises(LakeError, match="symbolic link"):
        lake.prune_checkpoints("runA", keep_last=1)
    assert _files(victim) == before
    (folder / "iteration=1").unlink()
    (folder / "checkpoints").mkdir()  # no checkpoint name: not a checkpoint
    shutil.rmtree(folder)
    folder.parent.joinpath("checkpoints").symlink_to(victim, target_is_directory=True)
    with pytest.raises(LakeError, match="symbolic link"):
        lake.prune_checkpoints("runA", keep_last=1)
    assert _files(victim) == before


def test_commit_markers_are_never_written_through_a_link(lake, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.rmtree(lake.root / "_commits" / "runA", ignore_errors=True)
    (lake.root / "_commits" / "runA").symlink_to(outside, target_is_directory=True)
    with pytest.raises(LakeError, match="symbolic link"):
        lake.commit_iteration("runA", 9, {})
    assert list(outside.iterdir()) == []


# -- a marker's merged file must hold the replaced rows, not just as many -------------------------------------------
def test_a_forged_merged_file_of_the_right_size_never_lets_compaction_delete_rows(lake):
    """The marker names the partition's part files as replaced by a 'merged' file that holds as many rows of that
    partition, but other ones (the rollout rows repeated, the validation rows gone): compaction used to delete the
    replaced files for good, since only the counts were checked."""
    folder = lake.partition_dir("trajectories", "runC", 0)
    parts = lake.partition_files("trajectories", "runC", 0)
    rollout = pq.read_table(next(p for p in parts if p.name == published_part_name(Stage.ROLLOUT, 0)))
    rows = sum(pq.read_metadata(p).num_rows for p in parts)
    forged = pa.concat_tables([rollout] * (rows // rollout.num_rows + 1)).slice(0, rows)
    merged = merged_name([p.name for p in parts])
    pq.write_table(forged, folder / merged)
    marker = {"merged": merged, "replaces": [p.name for p in parts], "rows": rows}
    (folder / COMPACTION_MARKER).write_text(json.dumps(marker))
    contents = {p: p.read_bytes() for p in parts}
    # the forged file is no part the lake published: refused as such, naming it
    _one_line_error(
        _cli("runs", "compact", "runC", "--data-root", lake.root),
        str(folder / merged),
        "is not among the parts the lake published",
    )
    assert {p: p.read_bytes() for p in parts if p.exists()} == contents
    # a forger who also writes it into the record of published parts still deletes nothing: its rows repeat keys
    # (the rollout rows twice), which the compaction checks before anything changes
    record_parts(folder, {merged: (folder / merged).stat().st_size})
    refused = _cli("runs", "compact", "runC", "--data-root", lake.root)
    _one_line_error(refused, str(folder), "held by more than one row")
    assert {p: p.read_bytes() for p in parts if p.exists()} == contents  # nothing deleted
    # a real merged file of the same parts (the forgery removed) is accepted: the same files, no other change
    (folder / merged).unlink()
    (folder / COMPACTION_MARKER).unlink()
    assert _cli("runs", "compact", "runC", "--data-root", lake.root).exit_code == 0
    stored = sorted(r["split"] for r in lake.read_table("trajectories", "runC", 0).to_pylist())
    assert stored == sorted(t.split for t in lake.synthetic["runC"].trajectories if t.iteration == 0)


def test_a_compaction_stopped_before_its_deletions_is_still_finished(lake):
    """The legitimate case of the same check: every replaced file still there next to the real merged file."""
    before = lake.read_table("trajectories", "runC").to_pylist()
    folder = lake.partition_dir("trajectories", "runC", 0)
    kept = {p: p.read_bytes() for p in lake.partition_files("trajectories", "runC", 0)}
    assert _cli("runs", "compact", "runC", "--data-root", lake.root).exit_code == 0
    for path, content in kept.items():  # as if killed between the merged file's rename and the deletions
        path.write_bytes(content)  # (which the record of published parts still names then)
    record_parts(folder, {path.name: len(content) for path, content in kept.items()})
    result = _cli("runs", "compact", "runC", "--data-root", lake.root)
    assert result.exit_code == 0, result.output
    assert [p.name.startswith("part-compacted-") for p in folder.glob("part-*")] == [True]
    key = ["iteration", "split", "env", "group_id", "traj_index"]
    rows = lake.read_table("trajectories", "runC").to_pylist()
    assert sorted(tuple(r[k] for k in key) for r in rows) == sorted(tuple(r[k] for k in key) for r in before)


# -- the lake's JSON files: bounded in size and nesting, regular files only -----------------------------------------
def _plant_manifest(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "nested":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "huge":
        with open(path, "wb") as handle:  # sparse: no disk used, the size is what counts
            handle.truncate(MAX_JSON_BYTES + 1)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:  # not UTF-8
        path.write_bytes(b'{"run_id": "runB", "status": "\xff\xfe"}')


@pytest.mark.parametrize("kind", ["nested", "huge", "fifo", "folder", "latin1"])
def test_a_manifest_bomb_is_a_broken_run_and_one_line_everywhere(lake, kind):
    path = lake.run_dir("runB") / "manifest.json"
    _plant_manifest(path, kind)
    result = _cli("runs", "--data-root", lake.root, "-f", "json")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    statuses = {r["run_id"]: r["status"] for r in json.loads(result.stdout)}
    assert statuses == {"runA": "completed", "runB": "broken", "runC": "completed"}
    for command in (["sql", "SELECT count(*) FROM runs"], ["resume", "runB"], ["runs", "rm", "runB", "--yes"]):
        _one_line_error(_cli(*command, "--data-root", lake.root), "runB")
    # the other runs and the tables answer
    result = _sql_count(lake, "true", "--run", "runA")
    assert result.exit_code == 0 and json.loads(result.stdout)[0]["n"] > 0


def test_a_nested_compaction_marker_is_one_line(lake):
    folder = lake.partition_dir("trajectories", "runA", 0)  # two part files: readers consult the marker
    (folder / COMPACTION_MARKER).write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    before = _files(lake.root)
    _one_line_error(_cli("runs", "compact", "runA", "--data-root", lake.root), COMPACTION_MARKER, "nested")
    _one_line_error(_sql_count(lake, "true"), COMPACTION_MARKER, "nested")
    assert _files(lake.root) == before


@pytest.mark.parametrize("folder", ["update_group", "vllm_server"])
def test_the_run_folders_the_rollout_and_update_sides_write_are_never_links(tmp_path, folder):
    """The launched group's export and logs, and the vLLM server's log, are written into the run's folder: a link
    there (to a folder outside the data root) is refused before anything is written through it."""
    lake = DataLake(tmp_path / "root")
    outside = tmp_path / "outside"
    outside.mkdir()
    (lake.root / "runs" / "r").mkdir(parents=True)
    (lake.root / "runs" / "r" / folder).symlink_to(outside, target_is_directory=True)
    method = {"update_group": lake.update_group_dir, "vllm_server": lake.vllm_server_dir}[folder]
    with pytest.raises(LakeError, match="link"):
        method("r")
    if folder == "update_group":
        with pytest.raises(LakeError, match="link"):
            lake.policy_export_dir("r")
    assert list(outside.iterdir()) == []
