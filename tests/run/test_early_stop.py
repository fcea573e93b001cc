"""RAGEN-2's ``rollout_filter_empty_stop_steps`` (``algorithm.filter_empty_stop_steps``): training stops after that
many consecutive iterations whose filter kept nothing. RAGEN-2 (``ragen/trainer/agent_trainer.py``, ``fit``) counts
``consecutive_empty_filtered_steps`` (reset by a step that kept something) and ends training once it reaches the
setting (``config/base.yaml``: 5; 0 never stops). Ours decides from the committed iterations' stored metrics, so a
resumed run stops where the uninterrupted one did, and a run that stopped early and was validated is done."""

from __future__ import annotations

from ragen_core.config import build_config, stored_config
from ragen_core.run.decisions import Start, config_changes, decide_start, empty_filter_streak, stops_early
from schemas.manifest import RunManifest

EMPTY, KEPT = {"filter/kept_groups": 0.0}, {"filter/kept_groups": 2.0}


def ragen2_stop_step(kept_per_step: list[int], empty_stop_steps: int) -> int | None:
    """RAGEN-2's loop: the step (0-based) after which training ends, or None; its counter as in its ``fit``."""
    consecutive = 0
    for step, kept in enumerate(kept_per_step):
        if kept == 0:
            consecutive += 1
            if empty_stop_steps > 0 and consecutive >= empty_stop_steps:
                return step
            continue
        consecutive = 0
    return None


def ours_stop_step(kept_per_step: list[int], empty_stop_steps: int) -> int | None:
    """Ours: before each iteration, the rule over the committed history; the last iteration trained is the one
    before the stop."""
    history: list[dict[str, float]] = []
    for step, kept in enumerate(kept_per_step):
        history.append({"filter/kept_groups": float(kept)})
        if stops_early(history, empty_stop_steps):
            return step
    return None


def test_the_streak_counts_back_from_the_last_iteration():
    assert empty_filter_streak([]) == 0
    assert empty_filter_streak([EMPTY, EMPTY, KEPT]) == 0
    assert empty_filter_streak([EMPTY, KEPT, EMPTY, EMPTY]) == 2
    assert empty_filter_streak([EMPTY, EMPTY, EMPTY]) == 3
    assert not stops_early([EMPTY] * 9, 0)  # 0: never
    assert stops_early([KEPT, EMPTY, EMPTY], 2) and not stops_early([EMPTY, KEPT, EMPTY], 2)


def test_the_stop_falls_where_ragen2s_counter_stops():
    cases = [[2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 3], [0] * 7, [1, 0, 1, 0, 1, 0], [0, 0, 1, 0, 0, 0, 0, 0]]
    for kept in cases:
        for steps in (0, 1, 2, 3, 5):
            assert ours_stop_step(kept, steps) == ragen2_stop_step(kept, steps), (kept, steps)
    assert ours_stop_step([0] * 7, 5) == 4  # by hand: the fifth empty iteration is the last


def test_the_default_is_ragen2s_and_runs_stored_before_the_key_never_stopped():
    assert build_config({}).algorithm.filter_empty_stop_steps == 5
    old = build_config({}).to_dict()
    del old["algorithm"]["filter_empty_stop_steps"]
    assert build_config(stored_config(old)).algorithm.filter_empty_stop_steps == 0
    assert config_changes(old, build_config(stored_config(old)).to_dict()) == []
    assert config_changes(old, build_config({}).to_dict()) == ["algorithm.filter_empty_stop_steps"]


def test_a_run_that_stopped_early_and_was_validated_is_done():
    config = build_config({}, ["trainer.iterations=10"])
    manifest = RunManifest(run_id="r", config=config.to_dict(), config_hash=config.config_hash(), model_dir="/m")
    final = {"updated": False}
    # iterations 0-3 trained, then the final validation was committed as iteration 4
    assert decide_start(manifest, config, [0, 1, 2, 3, 4], [], final) is Start.EXTEND  # without the record
    stopped = manifest.updated(early_stop={"iteration": 4, "reason": "filter_empty_stop_steps", "steps": 5})
    assert decide_start(stopped, config, [0, 1, 2, 3, 4], [], final) is Start.DONE
    # stopped, but the final validation not yet committed: a resume (which then stops again at once)
    assert decide_start(stopped, config, [0, 1, 2, 3], [], {"updated": True}) is Start.RESUME
    longer = build_config({}, ["trainer.iterations=20"])  # more iterations do not reopen it (they would extend)
    assert decide_start(stopped, longer, [0, 1, 2, 3, 4], ["trainer.iterations"], final) is Start.DONE
    assert decide_start(manifest, longer, [0, 1, 2, 3, 4], ["trainer.iterations"], final) is Start.EXTEND
