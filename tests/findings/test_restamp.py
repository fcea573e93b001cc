"""The re-stamp's evidence cannot pass vacuously: the comparator sees one ULP, a sign of zero, a dropped row and a
duplicated one; a probe of real runs fails on an edit that moves numbers (a Bandit payout), refuses a changed counted
file that none of its runs executed, and passes, leaving a record that links the two fingerprints, on an edit that
moves nothing. The probes run on a clone of this repository with a finding of one point added, two commits apart."""

from __future__ import annotations

import json
import socket
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ragen_core.findings.bitwise import compare_numbers, compare_tables, run_labels
from ragen_core.findings.changes import executed_lines, reformatted, same_syntax, unexercised
from ragen_core.findings.restamp import (
    SIDE_STAMP,
    RestampError,
    Side,
    changed_counted_files,
    probe,
    probe_overrides,
    probe_paths,
    reaches,
    record_of,
    record_path,
    side_stamp,
    stamped_commit,
    stamped_side,
)
from ragen_core.findings.spec import REPO_ROOT
from ragen_core.storage import query

KEY = ("run_id", "iteration", "name")


def _metrics(values: list[float], names: list[str] | None = None) -> pa.Table:
    names = names or [f"m{i}" for i in range(len(values))]
    return pa.table(
        {
            "run_id": ["r"] * len(values),
            "iteration": pa.array([0] * len(values), pa.int32()),
            "name": names,
            "value": pa.array(values, pa.float64()),
        }
    )


def _one_ulp_up(value: float) -> float:
    return float(np.nextafter(value, np.inf))


def test_equal_tables_compare_equal_in_any_row_order():
    a = _metrics([0.1, 0.25, float("nan")])
    diff = compare_tables("metrics", a, a.take([2, 0, 1]), KEY)
    assert diff.equal and diff.old_rows == diff.new_rows == 3


def test_one_ulp_of_one_metric_is_a_difference():
    values = [0.1, 0.2 + 0.1, 7.0]
    changed = [values[0], _one_ulp_up(values[1]), values[2]]
    assert changed[1] != values[1] and abs(changed[1] - values[1]) < 1e-15  # the planted change is one ULP
    diff = compare_tables("metrics", _metrics(values), _metrics(changed), KEY)
    assert not diff.equal and diff.differing_cells == 1
    assert diff.cells[0][:2] == (("r", 0, "m1"), "value")
    assert "1 cell(s) differ" in diff.summary()


def test_a_sign_of_zero_and_one_ulp_inside_a_float32_list_are_differences():
    assert not compare_tables("metrics", _metrics([0.0]), _metrics([-0.0]), KEY).equal

    def table(logprobs):
        return pa.table({"k": [1], "behavior_logprobs": pa.array([logprobs], pa.list_(pa.float32()))})

    base = [-0.5, -1.25, 0.0]
    bumped = [-0.5, float(np.nextafter(np.float32(-1.25), np.float32(0))), 0.0]  # one float32 ULP
    assert compare_tables("t", table(base), table(base), ("k",)).equal
    assert compare_tables("t", table(base), table(bumped), ("k",)).differing_cells == 1


def test_a_dropped_row_and_a_duplicated_row_are_differences():
    full = _metrics([1.0, 2.0, 3.0])
    dropped = compare_tables("metrics", full, full.slice(0, 2), KEY)
    assert dropped.only_old == [("r", 0, "m2")] and not dropped.only_new and not dropped.equal
    doubled = compare_tables("metrics", full, pa.concat_tables([full, full.slice(1, 1)]), KEY)
    assert not doubled.equal and len(doubled.only_new) == 1 and doubled.new_rows == 4


def test_only_the_declared_timing_columns_are_left_out():
    def events(moment: int, value: float) -> pa.Table:
        return pa.table({"run_id": ["r"], "created_at": pa.array([moment], pa.int64()), "value": [value]})

    assert compare_tables("events", events(1, 0.5), events(2, 0.5), ("run_id",), skip=("created_at",)).equal
    assert not compare_tables("events", events(1, 0.5), events(2, 0.5), ("run_id",)).equal
    assert not compare_tables("events", events(1, 0.5), events(1, 0.75), ("run_id",), skip=("created_at",)).equal


def test_analysis_numbers_compare_bitwise_but_for_timing_keys():
    numbers = {"arms": {"keep": {"final_success": {"mean": 0.3, "n": 2}, "update_seconds_per_iteration": 1.5}}}
    assert compare_numbers(numbers, json.loads(json.dumps(numbers))) == []
    slower = json.loads(json.dumps(numbers))
    slower["arms"]["keep"]["update_seconds_per_iteration"] = 9.0  # a timing: never a difference
    assert compare_numbers(numbers, slower) == []
    moved = json.loads(json.dumps(numbers))
    moved["arms"]["keep"]["final_success"]["mean"] = _one_ulp_up(0.3)
    assert compare_numbers(numbers, moved) == ["/arms/keep/final_success/mean: 0.3 -> 0.30000000000000004"]
    assert compare_numbers({"curve": [1.0, 2.0]}, {"curve": [1.0]}) == ["/curve: 2 -> 1 items"]


def test_the_probe_keeps_the_bootstrap_on_but_short():
    quick = ["trainer.iterations=2", "bootstrap.enabled=false", "eval.every=1"]
    assert probe_overrides(quick) == [
        "trainer.iterations=2",
        "eval.every=1",
        "bootstrap.num_groups=8",
        "bootstrap.epochs=1",
    ]
    assert probe_overrides(["bootstrap.epochs=2"]) == ["bootstrap.epochs=2", "bootstrap.num_groups=8"]


REFLOWED = (
    '''def pick(xs, weights=(0.5,)):
    """Pick one."""
    return max(xs, key=lambda x: x * weights[0]) if xs else 'none'  # a comment
''',
    '''def pick(
    xs,
    weights=(0.5,),
):
    """Pick
    one, in other words."""
    return (
        max(
            xs,
            key=lambda x: (x * weights[0]),
        )
        if xs
        else "none"
    )
''',
)


def test_a_reformat_keeps_the_syntax_and_a_changed_token_does_not():
    before, after = REFLOWED
    assert same_syntax(before, after)  # lines, quotes, parentheses, trailing commas and the docstring moved
    assert not same_syntax(before, before.replace("(0.5,)", "(0.5)"))  # a one-tuple became a float
    assert not same_syntax(before, before.replace("x * weights", "x / weights"))
    assert not same_syntax(before, before.replace("'none'", "'None'"))


def test_a_reformatted_file_needs_no_executed_line_but_a_changed_one_does(tmp_path):
    before, after = REFLOWED
    old, new = tmp_path / "old", tmp_path / "new"
    for tree, text in ((old, before), (new, after)):
        (tree / "ragen_core" / "envs").mkdir(parents=True)
        (tree / "ragen_core" / "envs" / "pick.py").write_text(text)
    changed = changed_counted_files(old, new)
    assert list(changed) == ["ragen_core/envs/pick.py"]
    assert reformatted(changed, old, new) == ["ragen_core/envs/pick.py"]
    assert unexercised(changed, {}, new, reformatted(changed, old, new)) == {}
    (new / "ragen_core" / "envs" / "pick.py").write_text(after.replace("(0.5,)", "(0.25,)"))
    changed = changed_counted_files(old, new)
    assert reformatted(changed, old, new) == []
    assert unexercised(changed, {}, new, []) == {"ragen_core/envs/pick.py": "no line of it ran"}


def test_a_side_is_reused_only_under_an_equal_stamp(tmp_path, monkeypatch):
    """The stamp of a side's runs: an earlier side is kept only when its commit, commands, probe specs, launcher and
    steering environment are all those of now; any one of them changed, or its stamp file unreadable, runs it again."""
    tree, target = tmp_path / "code-old", tmp_path / "old"
    (tree / "configs" / "findings").mkdir(parents=True)
    spec = tree / "configs" / "findings" / "a.yaml"
    spec.write_text("finding: {claim: x}\n")
    launcher = tmp_path / "launch.py"
    launcher.write_text("print(1)\n")
    side = Side("c" * 40, "f" * 16, tree)
    commands = {"the findings' points": ["reproduce", "--all", "--quick", "--data-root", str(tmp_path / "run/data")]}
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    stamp = side_stamp(side, launcher, commands)
    target.mkdir()
    (target / SIDE_STAMP).write_text(json.dumps({**stamp, "seconds": 12.5}))
    assert stamped_side(target, side_stamp(side, launcher, commands)) == 12.5
    assert stamped_side(target, side_stamp(side, launcher, {**commands, "probe path x": ["train"]})) is None
    assert stamped_side(target, side_stamp(Side("d" * 40, "f" * 16, tree), launcher, commands)) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert stamped_side(target, side_stamp(side, launcher, commands)) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    spec.write_text("finding: {claim: y}\n")
    assert stamped_side(target, side_stamp(side, launcher, commands)) is None
    spec.write_text("finding: {claim: x}\n")
    launcher.write_text("print(2)\n")
    assert stamped_side(target, side_stamp(side, launcher, commands)) is None
    launcher.write_text("print(1)\n")
    assert stamped_side(target, side_stamp(side, launcher, commands)) == 12.5  # all back: kept again
    (target / SIDE_STAMP).write_text("{not json")
    assert stamped_side(target, stamp) is None
    (target / SIDE_STAMP).unlink()
    assert stamped_side(target, stamp) is None


# -- probes of real runs, on a clone ---------------------------------------------------------------------------------

TINY = """\
    finding:
      claim: a probe's own finding, one point
      analysis: echo_trap
      config: configs/bandit.yaml
      overrides: [trainer.num_threads=1, trainer.checkpoint_every=100, "env.val_envs=[bandit]"]
      variants: {starpo_s: [algorithm.preset=starpo_s]}
      seeds: 1
      quick:
        overrides: [trainer.iterations=1, bootstrap.enabled=false, rollout.env_groups=2, rollout.group_size=2,
                    rollout.max_new_tokens=8, actor.mini_batch_size=4, actor.micro_batch_size=4, eval.every=1,
                    eval.instances=2]
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return _git(repo, "rev-parse", "HEAD")


def _edit(repo: Path, name: str, old: str, new: str) -> None:
    path = repo / name
    text = path.read_text()
    assert text.count(old) == 1, f"{name}: {old!r}"
    path.write_text(text.replace(old, new))


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """This repository's committed tree with the one-point finding ``probe_tiny``, and four commits on it: the
    base, a Bandit payout moved together with an edit in the critic's update (no finding trains a critic), an
    edit that moves nothing, and one that moves nothing in the dataset env (which no finding plays)."""
    repo = tmp_path_factory.mktemp("restamp") / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(repo)], check=True)
    (repo / "configs" / "findings" / "probe_tiny.yaml").write_text(textwrap.dedent(TINY))
    commits = {"base": _commit(repo, "a probe's finding")}
    _edit(repo, "ragen_core/envs/bandit.py", "low_reward: float = 0.1,", "low_reward: float = 0.2,")
    losses = "        losses = (schedule.cliprange_value, algorithm.loss_agg_mode)\n"
    _edit(repo, "ragen_core/training/critic.py", losses, "        _ = 0\n" + losses)  # no finding trains a critic
    commits["moved"] = _commit(repo, "a payout moved, and a line no probe runs")
    _git(repo, "checkout", "-q", commits["base"])
    _edit(repo, "ragen_core/envs/bandit.py", "reward = self.low_reward\n", "reward = float(self.low_reward)\n")
    commits["same"] = _commit(repo, "a cast that moves nothing")
    _git(repo, "checkout", "-q", commits["base"])
    where = 'where = f"row {self.row_number} of'
    _edit(repo, "ragen_core/envs/dataset.py", where, where.replace("row_number}", "row_number!s}"))
    commits["dataset"] = _commit(repo, "names in the dataset env's scoring, which no finding runs")
    _git(repo, "checkout", "-q", commits["same"])
    (repo / "configs" / "findings" / "probe_new.yaml").write_text(
        textwrap.dedent(TINY).replace("a probe's own finding", "a finding the new commit adds")
    )
    commits["added"] = _commit(repo, "a finding registered, beside the cast that moves nothing")
    return repo, commits


@pytest.mark.process  # a git clone and re-stamp probes
def test_changed_counted_files_follow_the_code_form_not_the_words(clone, tmp_path):
    repo, commits = clone
    old, new = tmp_path / "old", tmp_path / "new"
    for folder, commit in ((old, commits["base"]), (new, commits["same"])):
        folder.mkdir()
        subprocess.run(f"git -C {repo} archive {commit} ragen_core | tar -x -C {folder}", shell=True, check=True)
    changed = changed_counted_files(old, new)
    assert list(changed) == ["ragen_core/envs/bandit.py"] and len(changed["ragen_core/envs/bandit.py"]) == 1
    (new / "ragen_core" / "envs" / "sokoban.py").write_text(
        (new / "ragen_core/envs/sokoban.py").read_text() + "# a note\n"
    )
    (new / "ragen_core" / "storage" / "lake.py").write_text("X = 1\n")  # plumbing: never counted
    assert list(changed_counted_files(old, new)) == ["ragen_core/envs/bandit.py"]


@pytest.fixture(scope="module")
def probe_folder(tmp_path_factory) -> Path:
    """The folder the two probes from the base commit share, as a user's ``--work-dir`` run again."""
    return tmp_path_factory.mktemp("probes") / "probe"


@pytest.fixture(scope="module")
def moved(clone, probe_folder):
    """The probe from the base to the moved payout, the first in the shared folder: it runs both sides."""
    repo, commits = clone
    lines: list[str] = []
    result = probe(
        repo, commits["base"], commits["moved"], probe_folder, log=lines.append, only=["probe_tiny"], paths=()
    )
    return result, lines


@pytest.mark.process  # a git clone and re-stamp probes
def test_a_probe_fails_on_a_moved_payout_and_refuses_a_file_it_never_ran(moved):
    result, lines = moved
    assert not result.old.reused and not any("reused" in line for line in lines)  # the folder's first probe
    assert not result.equal and not result.passed
    differing = {t.table: t for t in result.tables if not t.equal}
    assert {"trajectories", "turns"} <= set(differing), [t.summary() for t in result.tables]
    # the first moved cell is a Phoenix pull of the bootstrap's demonstrations: 0.1 before, 0.2 after
    key, column, old, new = differing["trajectories"].cells[0]
    assert key[0] == "bootstrap#1" and (column, old, new) == ("env_reward", 0.1, 0.2)
    assert set(result.changed) == {"ragen_core/envs/bandit.py", "ragen_core/training/critic.py"}
    assert result.unexercised == {"ragen_core/training/critic.py": "none of its 1 changed statement(s) ran"}
    assert any("critic.py: the probe did not exercise it" in line for line in result.problems())


@pytest.fixture(scope="module")
def added(clone, moved, probe_folder):
    """One probe, from the base to the commit that adds the finding ``probe_new`` on top of the cast that moves
    nothing, shared by the two tests below (a probe costs two sides of real runs). It runs in the folder of the
    moved payout's probe, from the same base and on the same finding: the old side is that probe's, reused."""
    repo, commits = clone
    only = ["probe_tiny", "probe_new"]
    return probe_folder, probe(
        repo, commits["base"], commits["added"], probe_folder, log=lambda _: None, only=only, paths=()
    )


@pytest.mark.process  # a git clone and re-stamp probes
def test_a_probe_passes_an_edit_that_moves_nothing_and_its_record_links_the_fingerprints(clone, moved, added):
    repo, commits = clone
    _, result = added
    assert result.passed, result.problems()
    # its old side is the moved payout's probe's (the same commit, specs, commands, libraries and machine), whose
    # rows the new side's equal (the comparison below); the record says so
    first, _ = moved
    assert result.old.reused and result.old.seconds == first.old.seconds and not result.new.reused
    assert result.old.lake == first.old.lake
    assert "ragen_core/envs/bandit.py" in result.changed  # the cast, run by the finding's point
    rows = {t.table: t.old_rows for t in result.tables}
    # one point: 1 iteration of 2 groups x 2 trained and validations of 2 instances at iterations 0 and 1, and the
    # bootstrap's own rows; every row compared
    assert rows["trajectories"] >= 2 * 2 + 2 * 2 and rows["metrics"] > 0
    assert result.points["probe_tiny"] == ["probe-tiny-quick-starpo-s#p0"]
    record = record_of(result)
    assert record["old_side_reused"] is True and record["seconds"]["old"] == first.old.seconds
    assert record["from"] == {"commit": commits["base"], "fingerprint": result.old.fingerprint}
    assert record["to"]["fingerprint"] == result.new.fingerprint != result.old.fingerprint
    path = record_path(repo, record)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    assert [r["to"]["commit"] for r in reaches(result.old.fingerprint, result.new.fingerprint, repo)] == [
        commits["added"]
    ]
    assert reaches(result.new.fingerprint, result.old.fingerprint, repo) is None  # a record vouches one way
    assert stamped_commit(repo, result.old.fingerprint, commits["base"]) == commits["added"]


@pytest.mark.process  # a git clone and re-stamp probes
def test_a_finding_the_new_commit_adds_runs_on_its_side_alone_and_is_named_in_the_record(clone, added, tmp_path):
    repo, commits = clone
    work, result = added
    assert result.passed, result.problems()
    assert result.findings == ["probe_tiny"] and result.added == ["probe_new"]
    # compared: the common finding's rows only, as many on both sides; the new one ran into a root of its own
    assert all(t.equal and t.old_rows == t.new_rows for t in result.tables)
    assert set(run_labels(result.new.lake).values()) == {"probe-tiny-quick-starpo-s#p0", "bootstrap#1"}
    assert (work / "new" / "out" / "probe_new-quick.json").is_file()
    assert not (work / "old" / "out" / "probe_new-quick.json").exists()
    assert "probe-new-quick" in json.dumps(sorted(p.name for p in (work / "new" / "added" / "runs").iterdir()))
    assert record_of(result)["new_findings"] == ["probe_new"]
    only = ["probe_tiny", "probe_new"]
    with pytest.raises(RestampError, match="no longer registers probe_new"):  # and the other way round
        probe(repo, commits["added"], commits["base"], tmp_path / "back", log=lambda _: None, only=only, paths=())


@pytest.mark.process  # a git clone and re-stamp probes
def test_a_probe_refuses_a_changed_default_before_any_run(clone, tmp_path):
    repo, commits = clone
    _git(repo, "checkout", "-q", commits["base"])
    _edit(
        repo,
        "ragen_core/config/optimisation.py",
        "teacher_prob: float = Field(\n        0.5,",
        "teacher_prob: float = Field(\n        0.6,",
    )
    default = _commit(repo, "a default moved")
    with pytest.raises(RestampError, match="spec, config or defaults of .*probe_tiny"):
        probe(repo, commits["base"], default, tmp_path / "probe", log=lambda _: None, only=["probe_tiny"], paths=())
    assert not (tmp_path / "probe" / "old.log").exists()  # refused before any run


SERVED_PATH = """
  served:     # a path the new commit adds, played over HTTP by an env server the probe starts
    config: configs/bandit.yaml
    serve: [bandit, --port, "{port}"]
    overrides: [env.remote=http://127.0.0.1:{port}, bootstrap.enabled=false, trainer.iterations=1,
                rollout.env_groups=2, rollout.group_size=2, rollout.max_new_tokens=8, actor.mini_batch_size=4,
                actor.micro_batch_size=4, eval.every=1, eval.instances=2, trainer.num_threads=1]
"""


@pytest.fixture(scope="module")
def path_probe(clone, tmp_path_factory):
    """One probe of the probe paths alone (``only`` empty: no finding's runs), shared by the two tests below (a probe
    costs two sides of real runs): from the base to the dataset env's change, which no finding runs, with a path
    the new commit adds to the file, ``served``, played over HTTP by an env server the probe starts."""
    repo, commits = clone
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]
    _git(repo, "checkout", "-q", commits["dataset"])
    with open(repo / "configs" / "restamp" / "paths.yaml", "a") as paths_file:
        paths_file.write(SERVED_PATH.format(port=port))
    fresh = _commit(repo, "a probe path the new commit adds, with its env server")
    work = tmp_path_factory.mktemp("paths") / "probe"
    result = probe(repo, commits["base"], fresh, work, log=lambda _: None, only=[], paths=["dataset", "served"])
    return work, result, port


@pytest.mark.process  # a git clone and re-stamp probes
def test_a_probe_path_vouches_for_code_that_no_finding_runs(path_probe):
    """The dataset env's change runs in no finding (a probe of the findings would refuse it, as the moved payout's
    probe refuses the critic's line), but the ``dataset`` probe path runs it: the probe of the paths passes."""
    work, result, _ = path_probe
    assert result.passed, result.problems()
    assert list(result.changed) == ["ragen_core/envs/dataset.py"]
    assert result.findings == [] and result.points == {}
    record = record_of(result)
    assert record["paths"]["dataset"][:4] == [
        "--config",
        "configs/dataset_arithmetic.yaml",
        "--run-id",
        "probe-dataset",
    ]
    # the path's run alone is in both lakes, and its rows are compared: as many on both sides, all equal
    assert set(run_labels(result.new.lake).values()) == {"train#1"}
    compared = {t.table: t for t in result.tables}
    assert compared["trajectories"].old_rows == compared["trajectories"].new_rows > 0
    assert all(t.equal for t in result.tables)
    path_rows = query(result.new.lake, "SELECT count(*) AS n FROM trajectories WHERE run_id = 'probe-dataset'")
    assert path_rows.to_pylist()[0]["n"] == compared["trajectories"].new_rows
    covered = executed_lines(work / "coverage.data", result.new.tree)
    assert list(covered) == ["ragen_core/envs/dataset.py"] and covered["ragen_core/envs/dataset.py"]  # it ran it,
    # and coverage measured the changed file alone (tracing every line of ragen_core cost each command ~45%)
    assert not (work / "new" / "out").exists()  # no finding's numbers were made


@pytest.mark.process  # a git clone, a re-stamp probe and an env server
def test_a_probe_path_the_new_commit_adds_runs_on_its_side_alone_with_its_env_server(path_probe):
    """A path the old commit's file does not declare is the new commit's alone (its features may not exist before
    it): the old side never runs it, the new side runs it into its own data root, under the env server the path
    names, and the rows compared are those of the paths both sides declare."""
    work, result, port = path_probe
    assert result.passed, result.problems()
    assert result.fresh_paths == ["served"] and record_of(result)["new_paths"] == ["served"]
    assert set(run_labels(result.old.lake)) == set(run_labels(result.new.lake)) == {"probe-dataset"}
    served = query(work / "new" / "added", "SELECT count(*) AS n FROM trajectories WHERE run_id = 'probe-served'")
    assert served.to_pylist()[0]["n"] > 0  # played over HTTP: the server answered every reset and step
    assert "ragen env serve bandit" not in (work / "old.log").read_text()
    assert f"ragen env serve: http://127.0.0.1:{port}" in (work / "new-server.log").read_text()


def test_probe_paths_are_read_from_the_checkout_and_unknown_ones_refused(tmp_path):
    paths = probe_paths(REPO_ROOT)
    assert {"dataset", "async", "async_tis", "diagnostics", "launched"} <= set(paths)
    assert all(args[:2] == ["train", "--config"] and (REPO_ROOT / args[2]).is_file() for args in paths.values())
    assert probe_paths(REPO_ROOT, ["async"]) == {"async": paths["async"]}
    with pytest.raises(RestampError, match=r"unknown probe path\(s\) \['nope'\]"):
        probe_paths(REPO_ROOT, ["nope"])
    assert probe_paths(tmp_path) == {}  # a checkout without the file: no path
