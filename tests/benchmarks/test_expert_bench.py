"""``python -m benchmarks.expert_bench``: the expert's plays, the table and the refusal of bad input (few seeds)."""

from __future__ import annotations

import pytest

from benchmarks.expert_bench import main, measure, play
from ragen_core.envs import make_env


def test_play_matches_a_step_by_step_replay_of_the_expert():
    # independently: re-plan after every single action (the bench plays whole plans); Rubik's expert is optimal and
    # deterministic, so both must solve in the same number of turns
    for seed in range(5):
        result = play("rubikscube", {"scramble_depth": 3}, seed)
        env = make_env("rubikscube", scramble_depth=3)
        env.reset(seed)
        steps = 0
        while not env.success:
            env.step(env.expert_plan(env.max_steps - steps)[0])
            steps += 1
        assert result.success and result.actions == steps <= 3 and result.max_tile is None


def test_2048_play_stops_at_the_target_and_reports_the_largest_tile():
    result = play("game_2048", {"target": 64}, 0)
    assert result.success and result.max_tile == 64 and 0 < result.actions < 700


def test_jobs_split_gives_the_same_plays_as_one_process():
    one = measure("sudoku", {}, 6, jobs=1)
    two = measure("sudoku", {}, 6, jobs=2)
    assert [(p.seed, p.success, p.actions) for p in one] == [(p.seed, p.success, p.actions) for p in two]
    assert [p.seed for p in two] == list(range(6))


def test_main_prints_one_row_per_env(capsys):
    assert main(["--envs", "sudoku,rubikscube", "--seeds", "4"]) == 0
    out = capsys.readouterr().out
    assert "| sudoku | 81 | 4/4 (100.0%) | 32.0 / 32 |" in out  # an easy 9x9 has int(81 * 0.4) = 32 empty cells
    assert "| rubikscube | 20 | 4/4 (100.0%) |" in out


def test_bad_input_is_refused_before_any_play(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["--envs", "nope"])
    assert raised.value.code == 2 and "unknown env(s) nope" in capsys.readouterr().err
    assert main(["--envs", "game_2048", "--options", "target=100"]) == 2
    assert "power of two" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--envs", "sudoku", "--options", "size"])
    assert "key=value" in capsys.readouterr().err
