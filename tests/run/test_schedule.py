"""One table, two schedules: a run's iterations are the rows of the iteration's table, walked in order by a
synchronous schedule and in lanes derived from the rows by an overlapped one (``trainer.max_staleness`` = k >= 1).

A stage planted as one function and one row runs in a synchronous run and in an async run, with nothing else
changed; a row that names no lane is refused, never dropped; a row that says why an async run cannot run it turns into
the config's refusal; and the schedule's decisions (which policy samples a batch, the batches a resume keeps, what a
resume or an extension refuses) are worked by hand here."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from ragen_core.config import build_config
from ragen_core.run.checks import build_run_config
from ragen_core.run.iteration import Step
from ragen_core.run.overlap import run_iterations
from ragen_core.run.schedule import Lane, Schedule, SyncOnly, sampling_version
from ragen_core.run.session import open_session
from ragen_core.run.stages import ITERATION
from ragen_core.storage import DataLake, query

RUN = "planted"
SMALL = {
    "env": {"name": "bandit", "val_envs": ["bandit"]},
    "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 8},
    "actor": {"mini_batch_size": 8, "micro_batch_size": 4},
    "trainer": {"iterations": 2, "checkpoint_every": 1, "num_threads": 1},
    "eval": {"every": 10, "instances": 2},
}
SAMPLED: list[tuple[int, int]] = []  # (k, iteration) of every batch the planted sampler-lane row ran on


def count_kept(session, iteration, state):
    """A planted learner-lane stage: the kept training rows of the iteration's published batch, read from the lake
    (in an async run, batch n is published before step n's learner lane starts), as a metric."""
    rows = session.lake.read_table("trajectories", session.run_id, iteration, columns=["split", "kept"])
    kept = rows.filter(pc.and_(pc.equal(rows["split"], "train"), rows["kept"]))
    state.metrics["planted/kept_rows"] = float(kept.num_rows)


def note_batch(session, iteration, state):
    """A planted sampler-lane stage: it sees the batch its lane just published."""
    assert state.batch is not None
    SAMPLED.append((session.schedule.staleness, iteration))


def planted_table() -> tuple[Step, ...]:
    """The iteration's table with the two planted rows (one function, one row each), nothing else changed."""
    at = [step.stage for step in ITERATION].index("update")
    rows = (Step("noted", note_batch, lane=Lane.SAMPLER), Step("counted", count_kept, lane=Lane.LEARNER))
    return (*ITERATION[:at], *rows, *ITERATION[at:])


@pytest.mark.parametrize("staleness", [0, 1], ids=["synchronous", "async"])
def test_a_stage_planted_as_one_function_and_one_row_runs_in_both_schedules(tmp_path, tiny_model_dir, staleness):
    trainer = {**SMALL["trainer"], "max_staleness": staleness}
    config = build_config({**SMALL, "model": {"path": str(tiny_model_dir)}, "trainer": trainer})
    lake = DataLake(tmp_path)
    session = open_session(config, lake, RUN, tiny_model_dir)
    committed = []
    try:
        assert session.schedule == Schedule(staleness)
        final = run_iterations(session, 0, committed=lambda i, m: committed.append(i), table=planted_table())
    finally:
        session.close()
    assert final == 2 and committed == [0, 1] and lake.committed_iterations(RUN) == [0, 1]
    assert sorted(i for k, i in SAMPLED if k == staleness) == [0, 1]  # the sampler lane's row, on every batch
    rows = query(
        tmp_path, "SELECT iteration, name, value FROM metrics WHERE name LIKE 'planted/%' OR name = 'time/counted'"
    ).to_pylist()
    by_name = {(r["iteration"], r["name"]): r["value"] for r in rows}
    kept = query(
        tmp_path, "SELECT iteration, count(*) AS n FROM trajectories WHERE split = 'train' AND kept GROUP BY ALL"
    ).to_pylist()
    assert {(r["iteration"], "planted/kept_rows"): float(r["n"]) for r in kept} == {
        key: value for key, value in by_name.items() if key[1] == "planted/kept_rows"
    }  # the learner lane's row: committed with each iteration, counted again from the published rows
    assert {key for key in by_name if key[1] == "time/counted"} == {(0, "time/counted"), (1, "time/counted")}


def test_the_lanes_are_the_tables_rows_and_a_row_without_a_lane_is_refused():
    lanes = Schedule(1).lanes(ITERATION)
    stages = {lane: [step.stage for step in rows] for lane, rows in lanes.items()}
    assert stages == {
        Lane.SAMPLER: ["generate", "persist", "validate", "filter"],  # diagnose: a synchronous run's alone
        Lane.LEARNER: ["evaluate", "update"],
        Lane.COMMIT: ["commit"],
    }
    assert all(row in ITERATION for rows in lanes.values() for row in rows)  # the rows themselves, not copies
    unplaced = (*ITERATION, Step("forgotten", lambda session, iteration, state: None))
    with pytest.raises(ValueError, match=r"rows \['forgotten'\] name no lane"):
        Schedule(1).lanes(unplaced)


def test_every_row_of_the_iteration_names_its_lane():
    """A new stage runs in both schedules: its row says where an async run runs it (or the lanes refuse it)."""
    assert [step.stage for step in ITERATION if not isinstance(step.lane, Lane)] == []


def test_a_row_that_an_async_run_cannot_run_is_the_configs_refusal():
    """The diagnose row says why an async run cannot run it; the config check refuses what turns it on, in the row's
    words, and a row planted with its own reason is refused the same way, with nothing else changed."""
    on = {"trainer": {"max_staleness": 2, "mi_diagnostic": True}}
    [line] = Schedule(2).refusals(build_config(on), ITERATION)
    assert line == (
        "trainer.mi_diagnostic scores each batch with the policy that sampled it, which an async run keeps only in "
        "its sampler (trainer.max_staleness=2): set trainer.max_staleness=0 to run the diagnose stage"
    )
    with pytest.raises(ValueError, match="trainer.mi_diagnostic scores each batch"):
        build_run_config(on)
    assert Schedule(0).refusals(build_config(on), ITERATION) == []  # a synchronous run runs it
    build_run_config({"trainer": {"mi_diagnostic": True}})
    reason = SyncOnly("rollout.enable_think", "needs what only a synchronous run has")
    planted = (*ITERATION, Step("probe", note_batch, lane=Lane.SAMPLER, sync_only=reason))
    assert Schedule(1).refusals(build_config({}), planted) == [  # enable_think: true by default
        "rollout.enable_think needs what only a synchronous run has (trainer.max_staleness=1): set "
        "trainer.max_staleness=0 to run the probe stage"
    ]
    assert Schedule(1).refusals(build_config({"rollout": {"enable_think": False}}), planted) == []
    assert "probe" not in [s.stage for rows in Schedule(1).lanes(planted).values() for s in rows]


def test_the_schedules_decisions_by_hand():
    sync, async2 = Schedule.of(build_config({})), Schedule.of(build_config({"trainer": {"max_staleness": 2}}))
    assert (sync.overlapped, sync.syncs_after_update, sync.samples_beside_learner) == (False, True, False)
    assert (async2.overlapped, async2.syncs_after_update, async2.samples_beside_learner) == (True, False, True)
    assert [async2.sampling_version(i) for i in range(5)] == [0, 0, 0, 1, 2]
    assert [sampling_version(i, 2) for i in range(5)] == [0, 0, 0, 1, 2]
    assert [sync.sampling_version(i) for i in range(3)] == [0, 1, 2]
    assert list(async2.batches_ahead(3, 10)) == [4] and list(async2.batches_ahead(9, 10)) == []
    assert list(sync.batches_ahead(3, 10)) == [] and list(async2.sampled_ahead(3)) == [4, 5]
    assert sync.extension_refusal("r", 4) is None and sync.skip_refusal("r", 4, "q") is None
    assert "iterations 4..5 would train on batches" in async2.extension_refusal("r", 4)
    assert "cannot skip an iteration" in async2.skip_refusal("r", 4, "q")
