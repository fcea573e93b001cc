"""The decisions of starting a run, without Prefect, files or engines: fresh / over / resume / done, the resume plan,
and the config comparison (keys added to the config after a run started count as unchanged at their default)."""

from __future__ import annotations

import copy

import pytest

from ragen_core.config import build_config
from ragen_core.run.decisions import (
    ResumeError,
    Start,
    config_changes,
    decide_start,
    final_evaluation,
    plan_resume,
)
from schemas.manifest import RunManifest


def test_a_key_the_old_run_lacks_is_unchanged_at_its_default_and_changed_otherwise():
    new = build_config({}).to_dict()
    old = copy.deepcopy(new)
    del old["monitor"]["trackers"]  # a run from before the key existed
    assert config_changes(old, new) == []
    off = build_config({}, ["monitor.trackers=[]"]).to_dict()
    assert config_changes(old, off) == ["monitor.trackers"]
    assert config_changes(new, off) == ["monitor.trackers"]
    assert config_changes(new, build_config({}, ["trainer.iterations=3"]).to_dict()) == ["trainer.iterations"]
    # a key the new config dropped is always a change
    extra = copy.deepcopy(new)
    extra["monitor"]["retired_key"] = 1
    assert config_changes(extra, new) == ["monitor.retired_key"]


def test_a_run_stored_before_the_think_prefix_resumes_without_it():
    """rollout.think_prefix came later with default true; a stored config without it behaved as false, so reading it
    back fills false, an unchanged resume sees no change, and a config that turns it on is a change."""
    from ragen_core.config import build_config, stored_config
    from ragen_core.run.decisions import config_changes

    old = build_config().to_dict()
    del old["rollout"]["think_prefix"]
    restored = build_config(stored_config(old))
    assert restored.rollout.think_prefix is False
    assert config_changes(old, restored.to_dict()) == []
    assert config_changes(old, build_config().to_dict()) == ["rollout.think_prefix"]
    assert "think_prefix" not in old["rollout"]  # the stored tree itself is not modified


CONFIG = build_config({}, ["trainer.iterations=3"])


def _manifest(**fields):
    stored = {"run_id": "r", "config": CONFIG.to_dict(), "config_hash": CONFIG.config_hash(), "model_dir": "/m"}
    return RunManifest(**{**stored, **fields})


def test_the_start_is_fresh_over_resume_or_done():
    assert decide_start(None, CONFIG, [], []) is Start.FRESH
    assert decide_start(_manifest(model_dir=None), CONFIG, [], []) is Start.OVER  # killed in its bootstrap
    assert decide_start(_manifest(), CONFIG, [], []) is Start.RESUME  # a session opened, nothing committed
    assert decide_start(_manifest(), CONFIG, [0, 1, 2], []) is Start.RESUME  # the final validation is missing
    assert decide_start(_manifest(), CONFIG, [0, 1, 2, 3], []) is Start.DONE  # 3 updates + the final validation


def test_a_changed_config_or_another_kind_of_run_is_refused_before_anything():
    longer = build_config({}, ["trainer.iterations=5"])
    with pytest.raises(ResumeError, match="changed keys: trainer.iterations.*--force-config trainer.iterations"):
        decide_start(_manifest(), longer, [0], [])
    assert decide_start(_manifest(), longer, [0, 1, 2], ["trainer"]) is Start.RESUME  # allowed: 3 more to go
    with pytest.raises(ResumeError, match="changed keys"):
        decide_start(_manifest(model_dir=None), longer, [], [])  # starting over checks the config too
    for kind in ("bootstrap", "evaluation", "offline"):
        with pytest.raises(ResumeError, match=f"is a {kind} run, not a training run"):
            decide_start(_manifest(kind=kind), CONFIG, [], [])


def test_the_plan_loads_the_newest_covered_checkpoint_and_replays_the_rest():
    five = build_config({}, ["trainer.iterations=5"])
    checkpoints = [(1, "c1"), (2, "c2"), (4, "c4")]
    plan = plan_resume("r", five, [0, 1, 2], [], checkpoints)  # 3 updates done: c4 is from a later attempt
    assert (plan.next_iteration, plan.checkpoint, plan.checkpoint_updates, plan.replay) == (3, "c2", 2, [2])
    plan = plan_resume("r", five, [0, 1, 2], [1], [])  # no checkpoint: replay every update but the skipped one
    assert (plan.checkpoint, plan.checkpoint_updates, plan.replay) == (None, 0, [0, 2])
    done = plan_resume("r", CONFIG, [0, 1, 2, 3], [], [(3, "c3")])  # iteration 3 is the final validation
    assert (done.next_iteration, done.checkpoint, done.replay) == (4, "c3", [])
    assert done.training_iterations(CONFIG) == [0, 1, 2]
    assert plan_resume("r", CONFIG, [0, 1, 2], [1], []).training_iterations(CONFIG) == [0, 2]
    quarantined = plan_resume("r", CONFIG, [0], [], [], quarantined="/q")
    assert (quarantined.next_iteration, quarantined.quarantined) == (1, "/q")


def test_a_gap_in_the_committed_iterations_is_an_edited_lake():
    with pytest.raises(ResumeError, match=r"gaps in its committed iterations \[0, 2\]"):
        plan_resume("r", CONFIG, [0, 2], [], [])


def test_a_completed_run_given_more_iterations_is_extended_and_one_given_fewer_is_refused():
    longer, shorter = build_config({}, ["trainer.iterations=5"]), build_config({}, ["trainer.iterations=2"])
    final, update = {"updated": False}, {"updated": True}
    # 3 updates + the final validation (iteration 3, no update): 2 more updates to go, the validation reopened
    assert decide_start(_manifest(), longer, [0, 1, 2, 3], ["trainer"], final) is Start.EXTEND
    assert decide_start(_manifest(), longer, [0, 1, 2, 3], ["trainer"]) is Start.EXTEND  # a commit without "updated"
    assert decide_start(_manifest(), CONFIG, [0, 1, 2, 3], [], final) is Start.DONE
    # the manifest already holds the longer config (killed before the reopening): the payload still says final
    stored_longer = _manifest(config=longer.to_dict())
    assert decide_start(stored_longer, longer, [0, 1, 2, 3], [], final) is Start.EXTEND
    assert decide_start(stored_longer, longer, [0, 1, 2, 3], [], update) is Start.RESUME  # 4 trained, 1 to go
    with pytest.raises(ResumeError, match="already trained 3 iterations, more than trainer.iterations=2"):
        decide_start(_manifest(), shorter, [0, 1, 2, 3], ["trainer"], final)
    with pytest.raises(ResumeError, match="already trained 3 iterations, more than trainer.iterations=2"):
        decide_start(_manifest(), shorter, [0, 1, 2], ["trainer"], update)  # interrupted after 3 updates
    assert decide_start(_manifest(), shorter, [0, 1], ["trainer"], update) is Start.RESUME  # still within 2


def test_the_final_validation_is_the_last_commit_that_ran_no_update():
    assert final_evaluation(_manifest(), [], None) is None
    assert final_evaluation(_manifest(), [0, 1, 2, 3], {"updated": False}) == 3
    assert final_evaluation(_manifest(), [0, 1, 2], {"updated": True}) is None
    assert final_evaluation(_manifest(), [0, 1, 2, 3], {"metrics": 9}) == 3  # before payloads said: 3 updates done
    assert final_evaluation(_manifest(), [0, 1, 2], {"skipped": True}) is None
