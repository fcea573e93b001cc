"""The teacher_mix scripted policy and the teacher-agreement diagnostic the rollout engine stores per turn."""

import json
import math

import pyarrow as pa
import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.envs import make_env
from ragen_core.monitor.metrics import perception, teacher_agreement
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.run.checks import load_run_config as load_config


def _replay(record, env_name, options):
    """The teacher's moves and the description at each state a turn saw, by replaying the actions."""
    env = make_env(env_name, **options)
    env.reset(record.env_seed)
    seen, budget = [], 10
    for turn in record.turns:
        seen.append((env.teacher_actions(budget), env.describe()))
        env.step(turn.actions[0])
        budget -= 1
    return seen


@pytest.mark.parametrize(("env_name", "options"), [("frozen_lake", {"is_slippery": False}), ("sokoban", {})])
@pytest.mark.parametrize("prob", [0.0, 0.5, 1.0])
def test_teacher_mix_takes_the_teacher_move_at_its_rate_and_thinks_the_state(tiny_policy, env_name, options, prob):
    _, tokenizer = tiny_policy
    spec = RolloutSpec(
        env_name,
        list(range(60)),
        2,
        max_turns=10,
        max_actions_per_turn=1,
        max_actions_per_traj=10,
        env_options=options,
    )
    backend = ScriptedBackend("teacher_mix", tokenizer, {"teacher_prob": prob})
    records = run_rollouts(spec, backend, ChatFormatter(tokenizer, reply_prefix="<think>"), seed=0)
    agree = expected = total = 0
    for record in records:
        for turn, (teacher, description) in zip(record.turns, _replay(record, env_name, options), strict=True):
            assert turn.think == description and turn.valid and len(turn.actions) == 1
            assert turn.info["think_right"] is True  # the engine's perception diagnostic at the same state
            if teacher and len(teacher) < 4:
                total += 1
                agree += turn.actions[0] in teacher
                expected += prob + (1 - prob) * len(teacher) / 4
                # the engine's diagnostic, computed at the same state
                assert turn.info["teacher_actions"] == teacher
                assert turn.info["teacher_agree"] == (turn.actions[0] in teacher)
                assert turn.info["teacher_chance"] == len(teacher) / 4
    assert total > 200
    if prob == 1.0:
        assert agree == total
    else:  # a sum of independent Bernoulli draws: within 4 standard deviations of its expectation
        assert abs(agree - expected) < 4 * math.sqrt(total * 0.25)


def test_agreement_metric_against_a_hand_count():
    infos = [
        {"teacher_actions": ["Down"], "teacher_agree": True, "teacher_chance": 0.25},
        {"teacher_actions": ["Down", "Right"], "teacher_agree": False, "teacher_chance": 0.5},
        {"action_is_effective": [True]},  # no teacher preference at this state: not counted
        {"teacher_actions": ["Up"], "teacher_agree": True, "teacher_chance": 0.25},
    ]
    turns = pa.table({"info": [json.dumps(i) for i in infos]})
    assert teacher_agreement(turns, "val/frozen_lake") == {
        "val/frozen_lake/teacher_agreement": pytest.approx(2 / 3),
        "val/frozen_lake/teacher_chance": pytest.approx((0.25 + 0.5 + 0.25) / 3),
    }
    assert teacher_agreement(pa.table({"info": [json.dumps({})]}), "rollout") == {}


def test_perception_metric_against_a_hand_count():
    infos = [{"think_right": True}, {"think_right": False}, {}, {"think_right": True, "teacher_agree": False}, None]
    turns = pa.table({"info": [json.dumps(i) if i is not None else None for i in infos]})
    assert perception(turns, "val/sokoban") == {"val/sokoban/think_right": pytest.approx(2 / 3)}
    assert perception(pa.table({"info": [json.dumps({})]}), "rollout") == {}


def test_a_wrong_description_is_not_right(tiny_policy):
    _, tokenizer = tiny_policy
    spec = RolloutSpec(
        "frozen_lake",
        list(range(8)),
        1,
        max_turns=3,
        max_actions_per_turn=1,
        max_actions_per_traj=3,
        env_options={"is_slippery": False},
    )
    backend = ScriptedBackend("random", tokenizer, {})
    records = run_rollouts(spec, backend, ChatFormatter(tokenizer, reply_prefix="<think>"), seed=0)
    for record in records:
        for turn, (_, description) in zip(
            record.turns, _replay(record, "frozen_lake", {"is_slippery": False}), strict=True
        ):
            assert turn.info["think_right"] == (turn.think == description)
            assert turn.think != description  # the random policy thinks no description


def test_teacher_mix_needs_an_env_with_a_teacher():
    with pytest.raises(Exception, match="countdown has no teacher"):
        load_config("configs/countdown.yaml", ["bootstrap.policy=teacher_mix"])
    with pytest.raises(Exception, match="less than or equal to 1"):
        load_config("configs/frozenlake.yaml", ["bootstrap.teacher_prob=1.5"])
