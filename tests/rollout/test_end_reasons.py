"""How a trajectory ended (issue 66, the viewer's part): every trajectory records the env's state after its last step
and why it ended (the trajectories table's ``end_reason`` and ``final_state``), for every env. The expected values
are computed independently: the trajectory's actions replayed on a fresh env, and the reasons decided from that
replay and the stored turns by the rules of the table's description, with each env's own word for a loss written
out here."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.envs import make_env, registered_envs
from ragen_core.rollout import END_REASONS, RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.rollout.records import BatchMeta, trajectories_table
from ragen_core.storage import DataLake, query
from schemas.tables import TABLES, TRAJECTORIES, TableSpec

# the envs' own words for an episode they ended unsolved (TextEnv.end_reason), written out by hand
LOSS_WORDS = {
    "frozen_lake": "hole",
    "bandit": "worse_arm",
    "bandit_test": "worse_arm",
    "bandit_reversed": "worse_arm",
    "countdown": "wrong_answer",
    "game_2048": "no_moves",
    "calculator": "wrong_answer",
    "sql_agent": "wrong_answer",
    "search_qa": "wrong_answer",
}
DATASET = {
    "data_file": "examples/arithmetic/prompts.jsonl",
    "reward_fn": "examples.arithmetic.reward:score",
    "answer_column": "solution",
}


def _options(env: str) -> dict:
    return dict(DATASET) if env == "dataset" else {}


def _replay(record, options: dict):
    """A fresh env of the record's instance with the record's executed actions stepped again; its last step's flags."""
    env = make_env(record.env, **options)
    env.reset(record.env_seed)
    terminated = truncated = False
    for turn in record.turns:
        for action in turn.actions:
            _, _, terminated, truncated, _ = env.step(action)
    return env, terminated, truncated


def _expected(record, spec: RolloutSpec, options: dict) -> tuple[str, str]:
    """(end reason, final state) by the rules of the trajectories table's description, from the replay."""
    env, terminated, truncated = _replay(record, options)
    last = record.turns[-1]
    if terminated:
        reason = "success" if env.success else LOSS_WORDS.get(record.env, "failure")
    elif env.success:
        reason = "success"
    elif truncated:
        reason = "env_step_limit"
    elif record.num_actions >= spec.max_actions_per_traj:
        reason = "action_budget"
    elif last.truncated:
        reason = "token_limit"
    else:
        assert len(record.turns) == spec.max_turns
        reason = "turn_limit" if last.valid else "format_error"
    return reason, env.render()


@pytest.mark.parametrize("env", registered_envs())
def test_every_env_reports_its_trajectories_end_and_final_state(tiny_policy, env):
    tokenizer = tiny_policy[1]
    spec = RolloutSpec(env, [3, 4, 5], 3, 3, 2, 4, env_options=_options(env))
    reasons = set()
    for policy in ("random", "expert"):
        try:
            records = run_rollouts(spec, ScriptedBackend(policy, tokenizer), ChatFormatter(tokenizer), seed=1)
        except NotImplementedError:  # an env without an expert
            continue
        for record in records:
            assert (record.end_reason, record.final_state) == _expected(record, spec, _options(env)), record.turns
            assert (record.end_reason == "success") == record.success
            reasons.add(record.end_reason)
    assert reasons <= set(END_REASONS) | {LOSS_WORDS.get(env, "failure")}


def _policy(replies: list[list[str]]):
    """A scripted policy that writes ``replies`` in order, the same for every trajectory (by its turn)."""
    turns: dict[int, int] = {}

    def policy(context, rng):
        turn = turns[id(context.env)] = turns.get(id(context.env), -1) + 1
        return replies[min(turn, len(replies) - 1)]

    return policy


def _one(tokenizer, env: str, replies: list[list[str]], turns: int, budget: int, seed: int = 0, **options):
    spec = RolloutSpec(env, [seed], 1, turns, 1, budget, env_options=options)
    backend = ScriptedBackend(_policy(replies), tokenizer)
    (record,) = run_rollouts(spec, backend, ChatFormatter(tokenizer), seed=0)
    assert (record.end_reason, record.final_state) == _expected(record, spec, options)
    return record


def _lake_next_to_a_hole() -> tuple[int, str]:
    """A seed whose lake starts at the top left with a hole right of or below the start, and the move into it."""
    for seed in range(500):
        env = make_env("frozen_lake", is_slippery=False)
        env.reset(seed)
        if env.position != (0, 0):
            continue
        if env.rows[0][1] == "H":
            return seed, "Right"
        if env.rows[1][0] == "H":
            return seed, "Down"
    raise AssertionError("no lake of seeds 0..499 has a hole next to its start")


def test_each_way_an_episode_ends_is_named(tiny_policy):
    tokenizer = tiny_policy[1]
    seed, into_hole = _lake_next_to_a_hole()
    record = _one(tokenizer, "frozen_lake", [[into_hole]], 3, 3, seed, is_slippery=False)
    assert record.end_reason == "hole" and "X" in record.final_state  # the player drawn in the hole
    start = make_env("frozen_lake", is_slippery=False).reset(seed)[0]
    assert start in record.turns[-1].observation and "X" not in start  # the last turn showed the player before it
    solved = _one(tokenizer, "bandit", [[make_env("bandit").better_arm]], 1, 1)
    assert solved.end_reason == "success" and solved.final_state == "You pulled Dragon."
    assert _one(tokenizer, "bandit", [["Phoenix"]], 1, 1).end_reason == "worse_arm"
    # at the start (top left) Up and Left bump into the edge: nothing ends until a limit does
    assert _one(tokenizer, "frozen_lake", [["Up"]], 3, 10, seed, is_slippery=False).end_reason == "turn_limit"
    assert _one(tokenizer, "frozen_lake", [["Left"]], 5, 2, seed, is_slippery=False).end_reason == "action_budget"
    invalid = _one(tokenizer, "frozen_lake", [["Up"], ["Unicorn"]], 2, 5, seed, is_slippery=False)
    assert invalid.end_reason == "format_error"
    scrambled = [_one(tokenizer, "rubikscube", [["U"]], 5, 5, s, max_steps=2).end_reason for s in range(4)]
    assert "env_step_limit" in scrambled


def test_a_reply_cut_at_the_token_limit_ends_it_so(tiny_policy):
    model, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [1, 2], 2, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    records = run_rollouts(spec, HFBackend(model, tokenizer, 1.0, 1), ChatFormatter(tokenizer), seed=0)
    assert all(r.turns[0].truncated for r in records)  # one token: never an end
    assert {r.end_reason for r in records} == {"token_limit"}
    assert all((r.end_reason, r.final_state) == _expected(r, spec, {}) for r in records)


def test_the_table_stores_them_and_older_lakes_read_them_as_null(tiny_policy, tmp_path):
    tokenizer = tiny_policy[1]
    spec = RolloutSpec("frozen_lake", [7, 8], 2, max_turns=2, max_actions_per_turn=2, max_actions_per_traj=4)
    records = run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), seed=2)
    table = trajectories_table(records, BatchMeta.training("new", 0, 1.0, "h"))
    assert table.column("end_reason").to_pylist() == [r.end_reason for r in records]
    assert table.column("final_state").to_pylist() == [r.final_state for r in records]
    lake = DataLake(tmp_path)
    lake.write_rows("trajectories", "new", 0, table.to_pylist(), stage="rollout")
    before = TableSpec("trajectories", TRAJECTORIES.columns_at(2), TRAJECTORIES.key, 2, TRAJECTORIES.description)
    old = DataLake(tmp_path, tables={**TABLES, "trajectories": before})  # the code before the columns existed
    rows = [{**row, "run_id": "old"} for row in table.drop_columns(["end_reason", "final_state"]).to_pylist()]
    old.write_rows("trajectories", "old", 0, rows, stage="rollout")
    found = query(tmp_path, "SELECT run_id, end_reason, final_state FROM trajectories").to_pylist()
    expected = [{"run_id": "new", "end_reason": r.end_reason, "final_state": r.final_state} for r in records]
    expected += [{"run_id": "old", "end_reason": None, "final_state": None}] * len(records)
    assert sorted(found, key=repr) == sorted(expected, key=repr)
    assert lake.read_table("trajectories", "old").column("end_reason").null_count == len(records)
    assert table.schema.field("end_reason").type == pa.string() and table.schema.field("final_state").nullable


def test_the_table_describes_every_end_reason():
    description = TRAJECTORIES.column("end_reason").description
    for reason in [*END_REASONS, *set(LOSS_WORDS.values()), "failure"]:
        assert f"'{reason}'" in description, reason
