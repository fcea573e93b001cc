"""The multiturn analysis' pieces: a run's lift against its standard error, and the reference levels measured by
scripted play, checked against hand computations and an exact dynamic program."""

import math

import numpy as np
import pytest

from ragen_core.config import load_config
from ragen_core.envs import make_env
from ragen_core.envs.held_out import validation_seeds
from ragen_core.findings.multiturn import lift, reference_levels


def test_a_lift_counts_when_large_and_beyond_two_standard_errors():
    counted = lift(0.5, 0.6, 256, 0.08)
    assert counted["se"] == pytest.approx(math.sqrt((0.25 + 0.24) / 256))  # 0.04375
    assert counted["lift"] == pytest.approx(0.1) and counted["lifted"]
    assert not lift(0.5, 0.58, 256, 0.08)["lifted"]  # 0.08 is not beyond 2 x 0.0439
    assert not lift(0.1, 0.17, 10_000, 0.08)["lifted"]  # beyond 2 s.e. but under the minimum lift
    assert not lift(0.6, 0.5, 256, 0.08)["lifted"]
    assert lift(None, 0.5, 256, 0.08) == {"first": None, "final": 0.5, "lift": None, "se": None, "lifted": False}


def _random_success_exact(rows: list[str], budget: int) -> float:
    """Non-slippery FrozenLake: probability that uniformly random moves reach G within ``budget`` moves."""
    size = len(rows)
    value = {(r, c): 1.0 if rows[r][c] == "G" else 0.0 for r in range(size) for c in range(size)}
    for _ in range(budget):
        new = {}
        for (r, c), v in value.items():
            if rows[r][c] in "GH":
                new[(r, c)] = v
                continue
            total = 0.0
            for dr, dc in ((0, -1), (1, 0), (0, 1), (-1, 0)):
                total += value[(min(max(r + dr, 0), size - 1), min(max(c + dc, 0), size - 1))] / 4
            new[(r, c)] = total
        value = new
    start = next((r, row.index("S")) for r, row in enumerate(rows) if "S" in row)
    return value[start]


def test_reference_levels_of_frozen_lake_without_slips():
    config = load_config(
        "configs/frozenlake.yaml",
        [
            "env.options.is_slippery=false",
            "env.max_turns=10",
            "env.max_actions_per_turn=1",
            "eval.instances=64",
            "bootstrap.policy=teacher_mix",
            "bootstrap.teacher_prob=0.5",
        ],
    )
    levels = reference_levels(config, "frozen_lake", repeats=8)
    assert list(levels) == ["random", "teacher mix p=0.5", "teacher"]
    env = make_env("frozen_lake", is_slippery=False)
    exact = []
    for seed in validation_seeds(config, "frozen_lake"):  # the maps held out for validation (tests/envs)
        env.reset(seed)
        exact.append(_random_success_exact(env.rows, 10))
    # 512 episodes of independent Bernoulli(p_i): within 4 standard deviations of the exact mean
    sd = math.sqrt(sum(p * (1 - p) for p in exact) * 8) / 512
    assert abs(levels["random"] - np.mean(exact)) < 4 * sd + 1e-9
    assert levels["teacher"] == 1.0  # every validation goal lies within 10 moves of its start
    assert levels["random"] + 0.2 < levels["teacher mix p=0.5"] < levels["teacher"] - 0.1


def test_the_overlap_counts_validation_states_met_in_training_or_the_bootstrap(tmp_path):
    """Two runs started from one bootstrap's model: the overlap of each is counted from the lake's first states
    (synthetic rows: a state is ``state <seed> turn 0``) and equals the set arithmetic done here in plain Python."""
    import pandas as pd

    from ragen_core.findings.analysis import Arm, Context, validation_overlap
    from ragen_core.storage import DataLake
    from tests.storage.synthetic import make_run, write_run

    lake = DataLake(tmp_path / "root")
    model = str(tmp_path / "root" / "models" / "bootstrap-x")
    boot = make_run(9, "bootstrap-x", "sokoban", iterations=1)
    boot.trajectories = [t for t in boot.trajectories if t.split == "train"]
    runs = [make_run(seed, f"run-{seed}", "sokoban", iterations=2) for seed in (1, 2)]
    val_seeds = {run.run_id: sorted({t.env_seed for t in run.trajectories if t.split == "val"}) for run in runs}
    # planted: run-1 trains on two of its validation states, the bootstrap played one of each run's
    runs[0].trajectories[0].env_seed = val_seeds["run-1"][0]
    runs[0].trajectories[4].env_seed = val_seeds["run-1"][1]
    boot.trajectories[0].env_seed = val_seeds["run-1"][2]
    boot.trajectories[4].env_seed = val_seeds["run-2"][0]
    for run, kind in ((boot, "bootstrap"), *((run, "train") for run in runs)):
        write_run(lake, run)
        manifest = lake.read_manifest(run.run_id)
        lake.write_manifest(run.run_id, manifest.updated(kind=kind, model_dir=model))
    expected = {}
    demos = {t.env_seed for t in boot.trajectories}
    for run in runs:
        trained = {t.env_seed for t in run.trajectories if t.split == "train"} | demos
        expected[run.run_id] = {"maps": len(val_seeds[run.run_id]), "seen": len(set(val_seeds[run.run_id]) & trained)}
    assert expected["run-1"]["seen"] >= 3 and expected["run-2"]["seen"] >= 1
    ctx = Context(lake, [], pd.DataFrame(), {}, "sokoban", {})
    arm = Arm("sokoban", "sokoban", [], [run.run_id for run in runs])
    assert validation_overlap(ctx, arm, "sokoban") == expected
