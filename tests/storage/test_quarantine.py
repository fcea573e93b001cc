"""Bad batches through the real stages and the real lake: quarantined with a report, published tables untouched."""

import hashlib
import json
import math

import pyarrow as pa
import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.rollout.records import BatchMeta, trajectories_table, turns_table
from ragen_core.run.batches import BatchPipeline, BatchRejected, BatchRules
from ragen_core.storage import DataLake, query

RUN, GROUP_SIZE, BOUNDS = "run-q", 4, (-0.1, 1.0)


@pytest.fixture(scope="module")
def records(tiny_policy):
    model, tokenizer = tiny_policy
    spec = RolloutSpec("bandit", [1, 2], GROUP_SIZE, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    return run_rollouts(spec, HFBackend(model, tokenizer, 1.0, 12), ChatFormatter(tokenizer), seed=0)


def _edit(table: pa.Table, column: str, row: int, change) -> pa.Table:
    field = table.schema.field(column)
    values = table[column].to_pylist()
    values[row] = change(values[row])
    return table.set_column(table.schema.get_field_index(column), field, pa.array(values, field.type))


def _cast(table: pa.Table, column: str, type_: pa.DataType) -> pa.Table:
    return table.set_column(table.schema.get_field_index(column), column, table[column].cast(type_))


def _published_snapshot(lake: DataLake) -> dict[str, str]:
    files = [p for p in lake.root.rglob("*.parquet") if not {"quarantine", "_staging"} & set(p.parts)]
    return {str(p.relative_to(lake.root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(files)}


def _key(traj_index: int, group_id: int = 0) -> dict:
    return {
        "run_id": RUN,
        "iteration": 1,
        "split": "train",
        "env": "bandit",
        "group_id": group_id,
        "traj_index": traj_index,
    }


BAD_BATCHES = {
    "wrong_type": (lambda t: _cast(t, "env_seed", pa.float64()), "trajectories.env_seed:dtype", None),
    "length_mismatch": (
        lambda t: _edit(t, "input_ids", 3, lambda ids: ids + [7]),
        "loss_mask_length_matches_input_ids",
        [_key(3)],
    ),
    "nan_logprob": (
        lambda t: _edit(t, "behavior_logprobs", 5, lambda lp: lp[:-1] + [math.nan]),
        "logprobs_finite",
        [_key(1, 1)],
    ),
    "reward_out_of_range": (
        lambda t: _edit(_edit(t, "env_reward", 2, lambda r: r + 10.0), "total_reward", 2, lambda r: r + 10.0),
        "reward_in_bounds",
        [_key(2)],
    ),
    "duplicate_key": (lambda t: _edit(t, "traj_index", 1, lambda i: 0), "trajectories:unique_key", [_key(0)] * 2),
    "wrong_group_size": (lambda t: t.slice(0, 7), "group_size", [_key(i, 1) for i in range(3)]),
    "seeds_differ_in_group": (
        lambda t: _edit(t, "env_seed", 6, lambda s: s + 1),
        "group_seed_shared",
        [_key(i, 1) for i in range(4)],
    ),
    "policy_row_without_logprobs": (
        lambda t: _edit(t, "behavior_logprobs", 0, lambda lp: None),
        "policy_rows_have_logprobs",
        [_key(0)],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_a_bad_batch_is_quarantined_with_its_check_named(tmp_path, records, case):
    mutate, check, rows = BAD_BATCHES[case]
    lake = DataLake(tmp_path)
    rules = BatchRules(GROUP_SIZE, BOUNDS)
    good = BatchPipeline(lake, BatchMeta.training(RUN, 0, 1.0, "hash"), "rollout", rules)
    good.persist(records)
    good.validate()
    lake.publish(RUN, 0, "rollout")
    before, published_rows = _published_snapshot(lake), lake.read_table("trajectories").to_pylist()

    meta = BatchMeta.training(RUN, 1, 1.0, "hash")
    bad = BatchPipeline(lake, meta, "rollout", rules)
    bad.persist_tables(mutate(trajectories_table(records, meta)), turns_table(records, meta))  # a bad batch
    with pytest.raises(BatchRejected, match=check) as rejected:
        bad.validate()

    assert check in rejected.value.checks
    where = lake.quarantine_dir(RUN, 1, "rollout")
    assert rejected.value.quarantine == str(where)
    report = json.loads((where / "report.json").read_text())
    assert report["ok"] is False and check in report["failed_checks"]
    assert (report["run_id"], report["iteration"], report["stage"]) == (RUN, 1, "rollout")
    failure = next(f for f in report["failures"] if f["check"] == check)
    if rows is not None:
        assert failure["rows"] == rows
    assert sorted(p.name for p in (where / "trajectories").iterdir()) == ["part-rollout-00000.parquet"]
    assert (where / "turns" / "part-rollout-00000.parquet").is_file()
    assert not lake.stage_dir(RUN, 1, "rollout").exists()
    assert _published_snapshot(lake) == before
    assert lake.read_table("trajectories").to_pylist() == published_rows
    assert not lake.partition_files("trajectories", RUN, 1) and not lake.partition_files("turns", RUN, 1)
    assert query(tmp_path, "SELECT DISTINCT iteration FROM turns").to_pylist() == [{"iteration": 0}]


def test_an_unreadable_staged_batch_is_quarantined_too(tmp_path, records):
    lake = DataLake(tmp_path)
    pipeline = BatchPipeline(lake, BatchMeta.training(RUN, 0, 1.0, "hash"), "rollout", BatchRules(GROUP_SIZE, BOUNDS))
    pipeline.persist(records)
    (part,) = (lake.stage_dir(RUN, 0, "rollout") / "turns").glob("*.parquet")
    part.write_bytes(part.read_bytes()[:100])
    with pytest.raises(BatchRejected, match="staged_batch_readable"):
        pipeline.validate()
    report = json.loads((lake.quarantine_dir(RUN, 0, "rollout") / "report.json").read_text())
    assert report["failed_checks"] == ["staged_batch_readable"] and part.name in report["failures"][0]["detail"]
    assert lake.read_table("turns").num_rows == 0
