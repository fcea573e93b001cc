"""`ragen export` (issue 30, item 2): chosen runs' rows as a folder that Hugging Face ``datasets`` loads with one
line, splits train and validation holding the lake's split = 'train' and 'val' rows; read-only on the lake; a bad
request is one line on stderr, exit status 2, nothing written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from tests.storage.real_lake import RUNS, counts_of, expected_counts, make_real_lake

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def lake_root(prefect_harness, tmp_path_factory, tiny_model_dir) -> Path:
    return make_real_lake(tmp_path_factory.mktemp("export"), tiny_model_dir)


def _cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry of the data root with its size and modification time (locks aside: taken by readers too)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if "_locks" not in p.parts
    }


def _load(data_dir: Path, cache: Path) -> dict:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    return datasets.load_dataset("parquet", data_dir=str(data_dir), cache_dir=str(cache))


def _split_counts(lake_root: Path, table: str, runs: tuple[str, ...], split: str) -> dict:
    return {k: n for k, n in expected_counts(lake_root, table).items() if k[0] in runs and k[2] == split}


def test_export_loads_with_one_line_as_train_and_validation(lake_root, tmp_path):
    before = _snapshot(lake_root)
    out = tmp_path / "out"
    result = _cli("export", *RUNS, "--out", out, "--data-root", lake_root)
    assert result.exit_code == 0, result.output
    assert _snapshot(lake_root) == before  # read-only on the lake
    loaded = _load(out, tmp_path / "hf")
    assert sorted(loaded) == ["train", "validation"]
    for split, value in (("train", "train"), ("validation", "val")):
        rows = loaded[split].select_columns(["run_id", "iteration", "split"])
        assert counts_of([(r["run_id"], r["iteration"], r["split"]) for r in rows]) == _split_counts(
            lake_root, "trajectories", RUNS, value
        )
    expected_train = sum(_split_counts(lake_root, "trajectories", RUNS, "train").values())
    assert f"train {expected_train}" in result.output and f'data_dir="{out.resolve()}"' in result.output
    by_files = datasets.load_dataset(
        "parquet",
        data_files={"train": f"{out}/train/*.parquet", "validation": f"{out}/validation/*.parquet"},
        cache_dir=str(tmp_path / "hf"),
    )
    assert {k: v.num_rows for k, v in by_files.items()} == {k: v.num_rows for k, v in loaded.items()}


def test_the_printed_line_loads_an_export_whose_path_holds_glob_characters(lake_root, tmp_path):
    """Issue 66: ``datasets`` expands ``[...]`` in ``data_dir``, so the line printed for ``out[1]`` loaded a sibling
    export at ``out1`` (or nothing); the line names the folder escaped."""
    sibling, out = tmp_path / "out1", tmp_path / "out[1]"
    assert _cli("export", RUNS[0], "--out", sibling, "--data-root", lake_root).exit_code == 0
    result = _cli("export", *RUNS, "--out", out, "--data-root", lake_root)
    assert result.exit_code == 0, result.output
    [line] = {m.group(0) for m in re.finditer(r'load_dataset\("parquet", data_dir="[^"]+"\)', result.output)}
    assert f"`{line}`" in (out / "README.md").read_text()
    data_dir = re.search(r'data_dir="([^"]+)"', line).group(1)
    loaded = datasets.load_dataset("parquet", data_dir=data_dir, cache_dir=str(tmp_path / "hf"))
    for split, value in (("train", "train"), ("validation", "val")):
        assert loaded[split].num_rows == sum(_split_counts(lake_root, "trajectories", RUNS, value).values())


def test_export_of_two_tables_gives_one_dataset_folder_each(lake_root, tmp_path):
    out = tmp_path / "out"
    out.mkdir()  # an empty folder is fine
    result = _cli(
        "export", RUNS[1], "--table", "trajectories", "--table", "turns", "--out", out, "--data-root", lake_root
    )
    assert result.exit_code == 0, result.output
    for table in ("trajectories", "turns"):
        loaded = _load(out / table, tmp_path / "hf")
        for split, value in (("train", "train"), ("validation", "val")):
            expected = _split_counts(lake_root, table, (RUNS[1],), value)
            assert loaded[split].num_rows == sum(expected.values()) > 0, (table, split)
            assert set(loaded[split]["run_id"]) == {RUNS[1]}


@pytest.mark.parametrize(
    "case, expected",
    [
        ("unknown run", "unknown run 'nope'"),
        ("non-empty out", "is not an empty folder"),
        ("out in the lake", "inside the data root"),
        ("table without splits", "cannot export table 'metrics'"),
        ("unknown table", "cannot export table 'nope'"),
        ("bad run id", "run id"),
    ],
)
def test_a_bad_export_is_one_line_and_writes_nothing(lake_root, tmp_path, case, expected):
    out = tmp_path / "out"
    runs, table = [RUNS[0]], "trajectories"
    if case == "unknown run":
        runs = [RUNS[0], "nope"]
    elif case == "non-empty out":
        out.mkdir()
        (out / "mine.txt").write_text("keep")
    elif case == "out in the lake":
        out = lake_root / "exported"
    elif case in ("table without splits", "unknown table"):
        table = "metrics" if case == "table without splits" else "nope"
    elif case == "bad run id":
        runs = ["../x"]
    before, outside = _snapshot(lake_root), sorted(tmp_path.rglob("*"))
    result = _cli("export", *runs, "--table", table, "--out", out, "--data-root", lake_root)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(" ".join(lines).split("error:")) == 2 and lines[0].startswith("error:"), result.stderr
    assert expected in " ".join(result.stderr.split()) and "Traceback" not in result.output
    assert result.stdout == ""
    assert _snapshot(lake_root) == before and sorted(tmp_path.rglob("*")) == outside  # nothing written


@pytest.mark.parametrize("planted", ["link", "folder"])
def test_an_export_never_writes_through_what_is_planted_at_a_predictable_staging_name(lake_root, tmp_path, planted):
    """Issue 39 item 4: the staging folder was ``<parent>/.ragen-export-<name>-<pid>``, so a link planted there sent
    the export elsewhere. Every name one can predict (this process's pid, the pids around it, the old pattern with
    no pid) is planted with a link to a victim folder (or a folder of someone else's): the export succeeds, writes
    nothing into the victim, leaves what was planted as it was, and leaves no staging folder behind."""
    parent = tmp_path / "exports"
    parent.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir()
    names = [f".ragen-export-out-{pid}" for pid in range(max(os.getpid() - 50, 1), os.getpid() + 50)]
    names += [".ragen-export-out", ".ragen-export-out-"]
    for name in names:
        if planted == "link":
            (parent / name).symlink_to(victim, target_is_directory=True)
        else:
            (parent / name).mkdir()
            (parent / name / "theirs.txt").write_text("keep")
    result = _cli("export", RUNS[0], "--out", parent / "out", "--data-root", lake_root)
    assert result.exit_code == 0, result.output
    assert list(victim.iterdir()) == []
    left = sorted(p.name for p in parent.iterdir())
    assert left == sorted([*names, "out"])  # what was planted is still there; no staging folder of ours is left
    for name in names:
        path = parent / name
        assert path.is_symlink() if planted == "link" else (path / "theirs.txt").read_text() == "keep"
    exported = parent / "out"
    assert not exported.is_symlink() and (exported / "README.md").is_file() and any((exported / "train").iterdir())
    assert exported.stat().st_mode & 0o777 == 0o777 & ~_umask()  # the finished folder: as any folder the user makes


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask
