"""Run ids are names, never patterns, paths or SQL text: one validator, applied by every command (through the real
CLI), by the flows' parameters and by the lake's path helpers, before anything is created; listings built from a
run id match that run only; a run id reaches SQL as a parameter."""

from __future__ import annotations

import json
import shutil
import string
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.storage import DataLake, LakeError, checkpoint_row, query
from ragen_core.storage.names import RUN_ID_MAX_LENGTH, InvalidRunIdError, is_valid_run_id, validate_run_id
from schemas.manifest import RunManifest
from tests.storage.synthetic import make_run, write_run

ALLOWED = set(string.ascii_letters + string.digits + "._-")
HOSTILE = [
    "a*",
    "a?",
    "a[b]",
    "[/x]",
    "../x",
    "..",
    ".",
    ".hidden",
    "-rf",
    "o'x",
    'a"b',
    "a/b",
    "/abs",
    "a\\b",
    "",
    " ",
    "a b",
    "a\nb",
    "a\x00b",
    "é",
    "x" * (RUN_ID_MAX_LENGTH + 1),
    "a;DROP",
    "$(touch x)",
]
COUNT = "SELECT run_id, count(*) AS n FROM trajectories GROUP BY 1 ORDER BY 1"


def _independently_valid(text: str) -> bool:
    """The rule of ragen_core.storage.names written out character by character."""
    return 1 <= len(text) <= RUN_ID_MAX_LENGTH and all(c in ALLOWED for c in text) and text[0] not in ".-"


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for folders)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """Runs ``ab`` and ``a-b`` written once through the lake API (contract checks are slow); ``a`` does not exist."""
    lake = DataLake(tmp_path_factory.mktemp("template") / "lake")
    write_run(lake, make_run(1, "ab", "bandit", 1, groups=1, group_size=2))
    write_run(lake, make_run(2, "a-b", "bandit", 1, groups=1, group_size=2), created="2025-01-02T00:00:00+00:00")
    return lake.root


def _lake(template: Path, parent: Path) -> DataLake:
    """A copy of the template lake, where ``ab`` also has a checkpoint folder that its ``checkpoints`` rows name."""
    shutil.copytree(template, parent / "lake")
    lake = DataLake(parent / "lake")
    folder = lake.root / "runs" / "ab" / "checkpoints" / "iteration=1"
    folder.mkdir(parents=True)
    (folder / "checkpoint.json").write_text("{}")
    lake.write_rows("checkpoints", "ab", 1, [checkpoint_row("ab", 1, str(folder), "deepspeed", {})], stage="commit")
    return lake


@pytest.fixture()
def lake(template, tmp_path) -> DataLake:
    return _lake(template, tmp_path)


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _commands(root: Path, out: Path, run_id: str) -> dict[str, list]:
    """Every command that takes a run id (or a sweep id, the prefix of run ids), with ``run_id`` in that place;
    positional ids come after ``--`` so that ``-rf`` is an id, not an option."""
    data = ["--data-root", root]
    return {
        "train": ["train", *data, "--run-id", run_id],
        "resume": ["resume", *data, "--", run_id],
        "retrain": ["retrain", *data, "--from", "SELECT * FROM trajectories", "--init", "run:ab", "--run-id", run_id],
        "retrain --init": ["retrain", *data, "--from", "SELECT * FROM trajectories", "--init", f"run:{run_id}"],
        "eval": ["eval", *data, "--run-id", run_id, "ab"],
        "sweep": ["sweep", *data, "--sweep-id", run_id, "--grid", "seed=[1,2]"],
        "sql --run": ["sql", *data, "--run", run_id, COUNT],
        "runs rm": ["runs", "rm", *data, "--yes", "--force", "--", run_id],
        "runs compact": ["runs", "compact", *data, "--", run_id],
        "plot": ["plot", *data, "--out", out, "--", run_id],
    }


def _assert_refused(result, command: str, run_id: str) -> None:
    """Refused as a user error (status 2, no traceback) for the id itself: the validator's message for ``run_id``,
    naming it as the command's run id, sweep id or init run id, not some later failure."""
    assert result.exit_code == 2, (command, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), (command, result.exception)  # a user error, no traceback
    assert "Traceback" not in result.output
    with pytest.raises(InvalidRunIdError) as caught:
        validate_run_id(run_id)
    what = "sweep id" if command == "sweep" else "init run id" if "--init" in command else "run id"
    assert f"error: {what} {str(caught.value).removeprefix('run id ')}" in result.output, (command, result.output)


# -- the validator -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("run_id", ["a", "ab", "_x", "0", "sokoban-3f2a9c1e-20250101T000000", "a.b_c-d", "x" * 128])
def test_valid_ids_are_returned_unchanged(run_id):
    assert validate_run_id(run_id) == run_id and is_valid_run_id(run_id)


@pytest.mark.parametrize(
    ("run_id", "reason"),
    [
        ("a*", "contains '*'"),
        ("../x", "contains '/'"),
        (".", "starts with '.'"),
        ("..", "starts with '.'"),
        (".hidden", "starts with '.'"),
        ("-rf", "starts with '-'"),
        ("", "is empty"),
        ("o'x", 'contains "\'"'),
        ("x" * 129, "129 characters long (at most 128)"),
        ("é", "contains 'é'"),
    ],
)
def test_invalid_ids_say_what_is_wrong_and_how_to_fix_it(run_id, reason):
    with pytest.raises(InvalidRunIdError) as caught:
        validate_run_id(run_id)
    message = str(caught.value)
    assert reason in message and "letters, digits, '.', '_' or '-'" in message
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, LakeError)


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=140) | st.from_regex(r"\A[A-Za-z0-9._-]{1,130}\Z"))
def test_the_validator_matches_the_rule_written_out(text):
    assert is_valid_run_id(text) == _independently_valid(text)
    if _independently_valid(text):
        assert validate_run_id(text) == text
    else:
        with pytest.raises(InvalidRunIdError):
            validate_run_id(text)


# -- every command refuses a hostile id before anything is created -------------------------------------------------
@pytest.mark.parametrize("run_id", HOSTILE)
def test_every_command_refuses_a_hostile_id_and_changes_nothing(lake, tmp_path, run_id):
    before = _snapshot(tmp_path)  # the data root and its parent: '../x' must not create anything outside either
    for command, args in _commands(lake.root, tmp_path / "plot.png", run_id).items():
        _assert_refused(_invoke(*args), command, run_id)
        assert _snapshot(tmp_path) == before, command
    # eval's TARGET is a run id or a folder: one that is not a valid id is never looked up as a run, only as a folder
    result = _invoke("eval", "--data-root", lake.root, "--", run_id)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (result.output, result.exception)
    assert f"error: {run_id!r} is neither a run id in" in result.output and "Traceback" not in result.output
    assert _snapshot(tmp_path) == before


invalid_ids = st.text(st.characters(codec="utf-8"), max_size=140).filter(lambda t: not _independently_valid(t))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run_id=invalid_ids)
def test_any_invalid_id_is_refused_by_every_command(lake, tmp_path, run_id):
    before = _snapshot(tmp_path)
    for command, args in _commands(lake.root, tmp_path / "plot.png", run_id).items():
        _assert_refused(_invoke(*args), command, run_id)
    assert _snapshot(tmp_path) == before


valid_ids = st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9._-]{0,127}\Z")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run_id=valid_ids)
def test_a_valid_id_round_trips_through_the_commands(template, run_id):
    assume(run_id not in ("ab", "a-b"))
    with tempfile.TemporaryDirectory() as folder:
        lake = _lake(template, Path(folder))
        run = make_run(5, run_id, "bandit", 0, groups=1, group_size=2)  # validation rows of iteration 0 only
        write_run(lake, run)
        result = _invoke("sql", "--data-root", lake.root, "--run", run_id, COUNT, "-f", "json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == [{"run_id": run_id, "n": len(run.trajectories)}]
        listed = json.loads(_invoke("runs", "--data-root", lake.root, "-f", "json").stdout)
        assert sorted(r["run_id"] for r in listed) == sorted(["ab", "a-b", run_id])
        assert _invoke("runs", "compact", "--data-root", lake.root, "--", run_id).exit_code == 0
        result = _invoke("runs", "rm", "--data-root", lake.root, "--yes", "--", run_id)
        assert result.exit_code == 0, result.output
        assert query(lake, "SELECT DISTINCT run_id FROM trajectories ORDER BY 1").to_pylist() == [
            {"run_id": "a-b"},
            {"run_id": "ab"},
        ]
        assert (lake.root / "runs" / "ab" / "checkpoints" / "iteration=1" / "checkpoint.json").is_file()


# -- patterns never reach another run ------------------------------------------------------------------------------
def test_a_star_cannot_touch_run_ab(lake, tmp_path):
    checkpoint = lake.root / "runs" / "ab" / "checkpoints" / "iteration=1"
    before = _snapshot(tmp_path)
    for args in (
        ["runs", "rm", "--data-root", lake.root, "--yes", "--force", "a*"],
        ["sql", "--data-root", lake.root, "--run", "a*", COUNT],
        ["resume", "--data-root", lake.root, "a*"],
    ):
        result = _invoke(*args)
        _assert_refused(result, args[0], "a*")
        assert "run id 'a*' contains '*'" in result.output
    assert _snapshot(tmp_path) == before and (checkpoint / "checkpoint.json").is_file()
    for call in (
        lambda: lake.read_table("trajectories", "a*"),
        lambda: lake.partition_files("checkpoints", "a*"),
        lambda: lake.read_runs("a*"),
        lambda: lake.committed_iterations("a*"),
    ):
        with pytest.raises(InvalidRunIdError):
            call()
    # a run id that prefixes another ('a' of 'ab') lists nothing of it: the run's own folder, not a pattern
    assert lake.partition_files("trajectories", "a") == [] and lake.read_runs("a").num_rows == 0
    ab_files = lake.partition_files("trajectories", "ab")
    assert ab_files and all(f.parent.parent == lake.run_partition_dir("trajectories", "ab") for f in ab_files)
    assert lake.read_table("trajectories", "ab").num_rows == sum(pq.read_metadata(f).num_rows for f in ab_files)


def test_the_lake_refuses_hostile_ids_before_writing(lake, tmp_path):
    """The lake's own methods are a backstop behind the entry points: nothing is written for a hostile id."""
    before = _snapshot(tmp_path)
    rows = [{"run_id": "../x", "iteration": 0, "name": "m", "value": 1.0}]
    writes = (
        lambda: lake.write_manifest("../x", RunManifest(run_id="../x")),
        lambda: lake.write_rows("metrics", "../x", 0, rows, stage="commit"),
        lambda: lake.commit_iteration("..", 0, {}),
        lambda: lake.mark_stage_done("a*", 0, "rollout"),
        lambda: lake.quarantine(".x", 0, "rollout", "{}"),
    )
    for write in writes:
        with pytest.raises(InvalidRunIdError):
            write()
    assert _snapshot(tmp_path) == before


def test_flows_refuse_hostile_ids_in_their_parameters(lake, tmp_path):
    """The flows' own functions (what a deployment run calls) validate before reading or creating anything."""
    from flows.evaluate import evaluate
    from flows.retrain import retrain_offline
    from flows.sweep import sweep
    from flows.train import train

    before = _snapshot(tmp_path)
    root = str(lake.root)
    calls = {
        "train": lambda: train.fn(None, data_root=root, run_id="../x"),
        "retrain": lambda: retrain_offline.fn(None, "SELECT 1", "sft", "run:ab", data_root=root, run_id="a*"),
        "evaluate": lambda: evaluate.fn("ab", data_root=root, run_id=".."),
        "sweep": lambda: sweep.fn(None, grid=["seed=[1,2]"], data_root=root, sweep_id="a/b"),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidRunIdError):
            call()
        assert _snapshot(tmp_path) == before, name


# -- SQL takes a run id as a parameter -----------------------------------------------------------------------------
def test_queries_take_run_ids_as_parameters_even_when_validation_is_bypassed(lake, capsys):
    """Code paths that put a run id into SQL bind it: an id with a quote (refused by the validator, here passed
    straight to the query functions) finds nothing instead of breaking or changing the query."""
    from ragen_cli.summary import SUMMARY_SQL, print_run_summary
    from ragen_core.run.offline import OfflineError, select_trajectories
    from ragen_core.sweep import SweepPlan, compare_sweep

    hostile = "ab' OR '1'='1"
    assert query(lake, "SELECT count(*) AS n FROM trajectories WHERE run_id = ?", params=[hostile]).to_pylist() == [
        {"n": 0}
    ]
    with pytest.raises(OfflineError, match="returned no trajectories"):
        select_trajectories(lake, "SELECT * FROM trajectories WHERE run_id = ?", params=[hostile])
    assert compare_sweep(lake, SweepPlan(hostile, {}, [])).num_rows == 0
    print_run_summary(lake, hostile, None)  # the end-of-run summary: no rows, no error
    print_run_summary(lake, "ab", None)
    assert "WHERE run_id = 'ab'" in capsys.readouterr().out  # shown to copy; run with the id as a parameter
    train = [t for t in make_run(1, "ab", "bandit", 1, groups=1, group_size=2).trajectories if t.split == "train"]
    rows = query(lake, SUMMARY_SQL, params={"run_id": "ab"}).to_pylist()
    assert [(r["iteration"], r["split"], r["env"], r["trajectories"]) for r in rows if r["split"] == "train"] == [
        (0, "train", "bandit", len(train))
    ]
    validation = [t for t in make_run(1, "ab", "bandit", 1, groups=1, group_size=2).trajectories if t.split == "val"]
    by_env = {(r["iteration"], r["env"]): r["trajectories"] for r in rows if r["split"] == "val"}
    expected = {}
    for t in validation:  # the demo's summary gives each validation env its own row, never one average over envs
        expected[(t.iteration, t.env)] = expected.get((t.iteration, t.env), 0) + 1
    assert by_env == expected


def test_errors_show_the_users_text_as_typed(tmp_path):
    """A message quotes what the user typed literally: ':ab:' (rich's emoji code) and '[b]' (its markup) stay text."""
    missing = tmp_path / ":ab: [b]x[/b].yaml"
    result = _invoke("train", "--data-root", tmp_path / "lake", "--config", missing)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert f"error: config file {str(missing)!r} does not exist" in result.output
    assert not (tmp_path / "lake").exists()
