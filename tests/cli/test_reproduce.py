"""`ragen reproduce NAME --quick` on real tiny runs: the numbers equal independent SQL / Python computations over the
lake, the picture is a PNG, and bad names or outputs are refused before any compute."""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.findings import load_finding, plan_finding, registered, run_spec
from ragen_core.findings.analysis import Context, replay_warnings
from ragen_core.findings.provenance import code_fingerprint
from ragen_core.findings.spec import REPO_ROOT, spec_digest
from ragen_core.storage import DataLake, query

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


# The findings whose runs play an env that holds validation instances out (FrozenLake and Sokoban by map, the tool
# tasks by question): their held-out report is measured
HELD_OUT = {
    "multiturn_learning",
    "echo_trap_multiturn",
    "early_warnings_multiturn",
    "filtering_multiturn",
    "reasoning_multiturn",
    "async_staleness_frozenlake",
    "lora_frozenlake",
    "tool_use",
}


# Every registered finding; echo_trap first (its test also pays the module's first flow and imports), the
# asynchronous ones, the dearest, last
FINDINGS = sorted(registered(), key=lambda name: (name.startswith("async_staleness"), name != "echo_trap", name))


@pytest.fixture(scope="module")
def lake(prefect_harness, tmp_path_factory):
    """One data root for every finding of the module, the folder of their pictures and numbers, and the findings
    reproduced so far: each is reproduced once, ``--quick``, by the first test that reads it (:func:`_reproduced`)."""
    return tmp_path_factory.mktemp("findings-lake"), tmp_path_factory.mktemp("findings-out"), {}


def _reproduced(lake, name: str) -> tuple[dict, str]:
    """``ragen reproduce NAME --quick`` into the module's lake (once): its JSON and its output."""
    root, out, results = lake
    if name not in results:
        result = _invoke("reproduce", name, "--quick", "--data-root", str(root), "--out", str(out / f"{name}.png"))
        assert result.exit_code == 0, result.output
        results[name] = (json.loads((out / f"{name}.json").read_text()), result.output)
    return results[name]


def _runs(name: str, variant: str | None = None) -> list[str]:
    plans = plan_finding(load_finding(name), quick=True)
    return [p.run_id for item in plans if variant in (None, item.variant.name) for p in item.plan.points]


def _sql(root, sql: str, runs: list[str]) -> list[dict]:
    return query(root, sql, params={"runs": runs}).to_pylist()


@pytest.mark.parametrize("name", FINDINGS)
def test_each_finding_writes_its_png_and_numbers(lake, name):
    """Every registered finding, one test each (each pays for its own runs; those of a ``runs_of`` finding are
    reused when already made)."""
    numbers, output = _reproduced(lake, name)
    out = lake[1]
    data = (out / f"{name}.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    assert numbers["finding"] == name and numbers["quick"] is True
    assert numbers["versions"]["torch"] == metadata.version("torch")  # provenance: the libraries and the code
    assert set(numbers["code"]) == {"commit", "dirty", "fingerprint"}
    assert numbers["cpu"]["torch_capability"] == torch.backends.cpu.get_cpu_capability()  # the machine kind
    assert numbers["code"]["fingerprint"] == code_fingerprint(REPO_ROOT)
    assert numbers["spec_digest"] == spec_digest(load_finding(name))
    # validation held out: the runs of a finding on such envs never met a validation instance in training
    assert bool(numbers["held_out"]) == (name in HELD_OUT), (name, numbers["held_out"])
    for label, held in numbers["held_out"].items():
        assert held["held_out"] == "maps" and held["val_seen_in_training"]["max"] == 0.0, (name, label, held)
    assert f"wrote {out / f'{name}.png'}" in output.replace("\n", "")


def test_echo_trap_validation_and_group_std_match_the_trajectories(lake):
    root, numbers = lake[0], _reproduced(lake, "echo_trap")[0]["numbers"]
    for variant in ("starpo", "starpo_s"):
        runs = _runs("echo_trap", variant)
        finals = _sql(
            root,
            """
            SELECT run_id, avg(success::INT) AS s FROM trajectories t WHERE split = 'val' AND env = 'bandit'
              AND list_contains($runs, run_id)
              AND iteration = (SELECT max(iteration) FROM trajectories u WHERE u.run_id = t.run_id)
            GROUP BY run_id""",
            runs,
        )
        values = [row["s"] for row in finals]
        arm = numbers["arms"][variant]
        assert len(values) == 2 and arm["val_success_final"]["mean"] == pytest.approx(np.mean(values))
        assert arm["val_success_final"]["std"] == pytest.approx(np.std(values, ddof=1))
        stds = _sql(
            root,
            """
            WITH g AS (SELECT run_id, iteration, group_id, coalesce(stddev_samp(total_reward), 0) AS sd
                       FROM trajectories WHERE split = 'train' AND list_contains($runs, run_id) GROUP BY ALL),
                 r AS (SELECT run_id, iteration, avg(sd) AS sd FROM g GROUP BY ALL)
            SELECT iteration, avg(sd) AS sd, count(*) AS n FROM r GROUP BY iteration ORDER BY iteration""",
            runs,
        )
        curve = numbers["curves"][variant]["rollout/in_group_reward_std"]
        assert [(p["iteration"], p["n"]) for p in curve] == [(row["iteration"], row["n"]) for row in stds]
        assert [p["mean"] for p in curve] == pytest.approx([row["sd"] for row in stds])


def test_the_replayed_detector_gives_exactly_the_recorded_events(lake):
    root, numbers = lake[0], _reproduced(lake, "early_warnings")[0]["numbers"]
    runs = _runs("echo_trap")
    assert sorted(numbers["collapse_iteration"]) == sorted(runs)
    frame = query(
        root,
        "SELECT run_id, iteration, name, value FROM metrics WHERE list_contains($runs, run_id)",
        params={"runs": runs},
    ).to_pandas()
    config = plan_finding(load_finding("echo_trap"), quick=True)[0].plan.points[0].config.to_dict()
    context = Context(DataLake(root), [], frame, {}, "bandit", config)
    monitor = config["monitor"]
    assert monitor["reward_std_drop"] == monitor["entropy_drop"]  # the replay takes one drop for both
    recorded = 0
    for run in runs:
        events = _sql(
            root,
            "SELECT iteration, metric FROM events WHERE kind = 'early_warning' AND "
            "list_contains($runs, run_id) AND metric NOT LIKE 'diag/%' ORDER BY ALL",
            [run],
        )
        replayed = replay_warnings(context, run, monitor["reward_std_drop"], monitor["grad_norm_spike"])
        assert sorted(replayed) == [(row["iteration"], row["metric"]) for row in events]
        assert numbers["warnings"][run] == [list(e) for e in sorted(replayed)]
        recorded += len(events)
    assert recorded > 0  # the quick spec's hair-trigger thresholds make the runs warn: the comparison is not empty


def test_filtering_tokens_and_times_match_the_lake(lake):
    root, numbers = lake[0], _reproduced(lake, "filtering")[0]["numbers"]
    for ratio in ("0.25", "0.5", "1.0"):
        arm = numbers["arms"][f"algorithm.filter_ratio={ratio}"]
        runs = [
            r["run_id"]
            for r in _sql(
                root,
                "SELECT run_id FROM runs WHERE list_contains($runs, run_id) AND "
                f"overrides_json LIKE '%filter_ratio={ratio}%'",
                _runs("filtering"),
            )
        ]
        tokens = _sql(
            root,
            """
            SELECT iteration, sum(list_sum(loss_mask)) AS tokens FROM trajectories
            WHERE split = 'train' AND kept AND list_contains($runs, run_id) GROUP BY ALL ORDER BY ALL""",
            runs,
        )
        assert len(runs) == 1 and arm["trained_tokens_per_iteration"]["n"] == 1
        assert arm["trained_tokens_per_iteration"]["mean"] == pytest.approx(np.mean([t["tokens"] for t in tokens]))
        update = _sql(
            root,
            "SELECT avg(value) AS v FROM metrics WHERE name = 'time/update' AND list_contains($runs, run_id)",
            runs,
        )[0]["v"]
        assert arm["update_seconds_per_iteration"]["mean"] == pytest.approx(update)
    kept = {
        r: numbers["arms"][f"algorithm.filter_ratio={r}"]["trained_tokens_per_iteration"]["mean"]
        for r in ("0.25", "1.0")
    }
    assert kept["0.25"] < kept["1.0"]  # 1 of 2 groups kept against both


def test_reasoning_think_length_matches_the_turns(lake):
    root, numbers = lake[0], _reproduced(lake, "reasoning")[0]["numbers"]
    for variant in ("format_penalty", "no_format_penalty"):
        runs = _runs("reasoning", variant)
        turns = _sql(
            root, "SELECT iteration, think FROM turns WHERE split = 'train' AND list_contains($runs, run_id)", runs
        )
        by_iteration: dict[int, list[int]] = {}
        for row in turns:
            by_iteration.setdefault(row["iteration"], []).append(len(re.findall(r"\S+", row["think"] or "")))
        curve = numbers["curves"][variant]["think_words"]
        assert [p["iteration"] for p in curve] == sorted(by_iteration)
        assert [p["mean"] for p in curve] == pytest.approx([np.mean(by_iteration[i]) for i in sorted(by_iteration)])


def test_reproducing_again_reuses_the_completed_runs(lake):
    root, out, _ = lake
    _reproduced(lake, "echo_trap")
    before = _sql(
        root, "SELECT run_id, updated_at FROM runs WHERE list_contains($runs, run_id) ORDER BY 1", _runs("echo_trap")
    )
    result = _invoke("reproduce", "echo_trap", "--quick", "--data-root", str(root), "--out", str(out / "again.png"))
    assert result.exit_code == 0, result.output
    after = _sql(
        root, "SELECT run_id, updated_at FROM runs WHERE list_contains($runs, run_id) ORDER BY 1", _runs("echo_trap")
    )
    assert after == before
    first = json.loads((out / "echo_trap.json").read_text())["numbers"]
    assert json.loads((out / "again.json").read_text())["numbers"] == first


def test_list_shows_every_finding_with_its_claim():
    result = _invoke("reproduce", "--list")
    assert result.exit_code == 0
    for name in ("echo_trap", "early_warnings", "filtering", "diversity", "reasoning"):
        assert re.search(rf"^{name}: \S", result.output, re.MULTILINE)


@pytest.mark.parametrize("name", ["nope", "../configs/bandit", "echo_trap.yaml"])
def test_an_unknown_name_is_one_error_line_and_nothing_is_written(tmp_path, name):
    root = tmp_path / "lake"
    result = CliRunner().invoke(app, ["reproduce", name, "--data-root", str(root)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: unknown finding") and "echo_trap" in lines[0]
    assert "Traceback" not in result.output and not root.exists()


def test_a_bad_out_is_refused_before_anything_runs(tmp_path):
    root = tmp_path / "lake"
    for out, message in (
        (tmp_path / "x.jpg", "must be a .png"),
        (root / "x.png", "inside the data root"),
        (tmp_path, "must be a .png"),
    ):
        result = _invoke("reproduce", "echo_trap", "--data-root", str(root), "--out", str(out))
        assert result.exit_code == 2 and message in result.output
    result = _invoke("reproduce", "--data-root", str(root))
    assert result.exit_code == 2 and "--list" in result.output
    assert not root.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "HEAD"], "--from and --work-dir go with --restamp"),
        (["--work-dir", "w"], "--from and --work-dir go with --restamp"),
        (["--restamp", "echo_trap"], "--restamp probes every finding on its own"),
        (["--restamp", "--all"], "--restamp probes every finding on its own"),
        (["--restamp", "--quick"], "--restamp probes every finding on its own"),
    ],
)
def test_a_re_stamp_asked_wrongly_is_one_error_line_before_any_probe(args, message):
    result = CliRunner().invoke(app, ["reproduce", *args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output
    assert not Path("w").exists()  # no probe folder made


def test_all_reproduces_every_finding_into_one_folder_with_one_code_version(lake, tmp_path):
    """--all after every finding's own command (test_each_finding, into this lake): each finding's completed runs
    are reused, not made again, and its numbers and picture land in --out-dir, the numbers those of the finding's
    own command, all with the code version the command started with."""
    root = lake[0]
    alone = {name: _reproduced(lake, name)[0] for name in registered()}  # made by test_each_finding in a full run
    runs = [
        p.run_id
        for name in registered()
        for item in plan_finding(run_spec(load_finding(name)), quick=True)
        for p in item.plan.points
    ]
    made = "SELECT run_id, updated_at FROM runs WHERE list_contains($runs, run_id) ORDER BY 1"
    before = _sql(root, made, runs)
    for bad in (["echo_trap", "--all"], ["--all", "--out", str(tmp_path / "x.png")]):
        result = _invoke("reproduce", *bad, "--data-root", str(root))
        assert result.exit_code == 2 and "--all" in result.output, result.output
    result = _invoke("reproduce", "--all", "--quick", "--data-root", str(root), "--out-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert _sql(root, made, runs) == before and len(before) == len(set(runs))  # every point reused, none redone
    for name in registered():  # read from the lake: no sweep flow (and no Prefect server) started for them
        points = sum(len(item.plan.points) for item in plan_finding(run_spec(load_finding(name)), quick=True))
        assert f"{name}: its {points} run(s) completed in" in result.output, result.output
    written = {name: json.loads((tmp_path / f"{name}-quick.json").read_text()) for name in registered()}
    assert all((tmp_path / f"{name}-quick.png").read_bytes().startswith(PNG_MAGIC) for name in written)
    assert len({json.dumps(numbers["code"], sort_keys=True) for numbers in written.values()}) == 1
    assert all(numbers["spec_digest"] == spec_digest(load_finding(name)) for name, numbers in written.items())
    for name, numbers in written.items():  # the same runs analysed the same way as by the finding's own command
        assert numbers["command"] == f"ragen reproduce {name} --quick" and numbers["quick"] is True
        assert (numbers["numbers"], numbers["held_out"]) == (alone[name]["numbers"], alone[name]["held_out"]), name


def _context(root, name: str):
    from ragen_core.findings import load_context

    spec = load_finding(name)
    return load_context(DataLake(root), spec, plan_finding(spec, quick=True))


def test_the_learning_analysis_reads_validation_before_and_after(lake):
    from ragen_core.findings import ANALYSES

    root = lake[0]
    _reproduced(lake, "echo_trap")
    numbers = ANALYSES["learning"](_context(root, "echo_trap"))
    for variant in ("starpo", "starpo_s"):
        firsts = _sql(
            root,
            "SELECT run_id, success_rate AS s FROM evaluations WHERE env = 'bandit' AND iteration = 0 "
            "AND list_contains($runs, run_id)",
            _runs("echo_trap", variant),
        )
        expected = np.mean([row["s"] for row in firsts])
        assert len(firsts) == 2 and numbers["arms"][variant]["val_success_first"]["mean"] == pytest.approx(expected)


def _sokoban_description(grid: str) -> str:
    """Independently of the env: where the box lies from the player and its target from the box, read off the grid."""
    cells = {
        ch: [(r, c) for r, line in enumerate(grid.split("\n")) for c, x in enumerate(line) if x == ch] for ch in "PSXO"
    }
    (player,) = cells["P"] + cells["S"]
    (box,) = cells["X"]
    (target,) = cells["O"] + ([player] if cells["S"] else [])

    def way(a, b):
        parts = [("down" if b[0] > a[0] else "up")] if b[0] != a[0] else []
        parts += [("right" if b[1] > a[1] else "left")] if b[1] != a[1] else []
        return " and ".join(parts) or "here"

    return f"The box is {way(player, box)}. The target is {way(box, target)}."


def test_multiturn_learning_bootstraps_a_weak_prior_and_reads_lift_and_agreement(lake):
    from tests.envs.test_frozen_lake import _goal_from_render

    root, numbers = lake[0], _reproduced(lake, "multiturn_learning")[0]["numbers"]
    assert sorted(numbers["arms"]) == ["frozen_lake", "frozen_lake_history", "sokoban", "sokoban_history"]
    describe = {"frozen_lake": _goal_from_render, "sokoban": _sokoban_description}
    bootstraps = {}
    for label, arm in numbers["arms"].items():
        env = arm["env"]
        (run,) = _runs("multiturn_learning", label)
        assert label.removesuffix("_history") == env and list(arm["runs"]) == [run]
        evals = query(
            root,
            "SELECT iteration, success_rate AS s FROM evaluations WHERE env = $env AND "
            "run_id = $run ORDER BY iteration",
            params={"env": env, "run": run},
        ).to_pylist()
        first, final = evals[0]["s"], evals[-1]["s"]
        assert [e["iteration"] for e in evals] == [0, 1, 2]
        assert arm["runs"][run]["lift"] == pytest.approx(final - first)
        assert arm["val_success_final"]["mean"] == pytest.approx(final)
        # the agreement diagnostic is the share of the validation turns, where the teacher prefers some moves, whose
        # first action is one of the teacher's; the perception one the share whose thinking is the state's description
        agreement, right = (
            query(
                root,
                """
            SELECT avg(json_extract(info, '$.teacher_agree')::BOOLEAN::INT) AS a,
                   avg(json_extract(info, '$.think_right')::BOOLEAN::INT) AS r FROM turns
            WHERE run_id = $run AND split = 'val' AND iteration = 0
            """,
                params={"run": run},
            )
            .to_pylist()[0]
            .values()
        )
        assert arm["think_right_first"]["mean"] == pytest.approx(right)
        assert arm["agreement_first"]["mean"] == pytest.approx(agreement)
        assert list(arm["references"]) == ["random", "teacher mix p=0.3", "teacher"]
        assert arm["references"]["random"] < arm["references"]["teacher mix p=0.3"] < arm["references"]["teacher"]
        assert arm["verdict"] in ("reproduced", "partly", "not reproduced")
        # the arm's demonstrations (its run's bootstrap, in the arm's own context) think what the state shows
        bootstrap = DataLake(root).read_manifest(run).bootstrap["run_id"]
        bootstraps[label] = bootstrap
        turns = _sql(root, "SELECT observation, think FROM turns WHERE list_contains($runs, run_id)", [bootstrap])
        assert len(turns) >= 8
        for row in turns:
            assert "State:\n" in row["observation"] and "system" not in row["observation"]
            grid = row["observation"].split("State:\n", 1)[1].rsplit("\n", 1)[0]
            assert row["think"] == describe[env](grid)
    assert len(set(bootstraps.values())) == 4  # one per env and context: a history arm has a bootstrap of its own


def test_the_diversity_analysis_times_runs_by_their_stage_seconds(lake):
    from ragen_core.findings import ANALYSES

    root = lake[0]
    _reproduced(lake, "filtering")
    numbers = ANALYSES["diversity"](_context(root, "filtering"))
    seconds = _sql(
        root,
        """
        SELECT r.overrides_json AS o, sum(m.value) AS s FROM metrics m JOIN runs r USING (run_id)
        WHERE m.name LIKE 'time/%' AND m.name NOT LIKE '%_per_s' AND m.name <> 'time/step'
          AND list_contains($runs, run_id) GROUP BY ALL""",
        _runs("filtering"),
    )
    for row in seconds:
        label = " ".join(o for o in json.loads(row["o"]) if not o.startswith("seed="))
        assert numbers["arms"][label]["minutes"]["mean"] == pytest.approx(row["s"] / 60.0)


def test_a_finding_reproduced_in_a_bucket_has_the_numbers_of_a_local_root(lake, s3_root, tmp_path):
    """A data root in an object store (issue 71): the finding's sweeps commit into the bucket through this host's
    local copy, and the numbers read back equal those of the module's local data root."""
    url, server = s3_root
    local, _ = _reproduced(lake, "echo_trap")
    result = _invoke("reproduce", "echo_trap", "--quick", "--data-root", url, "--out", str(tmp_path / "bucket.png"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "bucket.json").read_text())["numbers"] == local["numbers"]
    keys = server.objects(url.split("/")[2])
    for run_id in _runs("echo_trap"):  # every point's run committed in the bucket, its manifest there
        assert f"lake/runs/{run_id}/manifest.json" in keys and f"lake/_commits/{run_id}/iteration=0.json" in keys
