"""Validation held out by map (ragen_core/envs/held_out.py): the maps a run validates on are maps that no training
or bootstrap seed of any run can draw. Which side a map is on is recomputed here from the map itself (SHA-256 of its
key, bucket 0 of 8), independently of the module's own function."""

import hashlib

import pytest

from ragen_core.config import build_config
from ragen_core.config.loading import stored_config
from ragen_core.envs import TextEnv, make_env
from ragen_core.envs.held_out import HeldOutError, split_seeds, validation_seeds
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from ragen_core.seeding import derive_seeds


def _validation_side(env_name: str, seed: int, **options) -> bool:
    env = make_env(env_name, **options)
    env.reset(seed)
    return int(hashlib.sha256(env.map_key().encode()).hexdigest()[:16], 16) % 8 == 0


def _maps(env_name: str, seeds: list[int], **options) -> set[str]:
    env = make_env(env_name, **options)
    keys = set()
    for seed in seeds:
        env.reset(seed)
        keys.add(env.map_key())
    return keys


@pytest.mark.parametrize("env_name", ["sokoban", "frozen_lake"])
def test_each_seed_lands_on_its_own_side_and_seeds_already_there_stay(env_name):
    seeds = list(range(300))
    val, train = split_seeds(env_name, {}, seeds, "val"), split_seeds(env_name, {}, seeds, "train")
    assert all(_validation_side(env_name, s) for s in val)
    assert not any(_validation_side(env_name, s) for s in train)
    for seed, v, t in zip(seeds, val, train, strict=True):
        on_val = _validation_side(env_name, seed)
        assert (v == seed) == on_val and (t == seed) == (not on_val)
    moved = sum(v != s for v, s in zip(val, seeds, strict=True))
    assert 0.75 * 300 < moved < 0.95 * 300  # about 7 in 8 seeds draw a training map
    assert split_seeds(env_name, {}, seeds, "val") == val  # a pure function of its arguments


@pytest.mark.parametrize("env_name", ["sokoban", "frozen_lake"])
def test_validation_maps_are_never_training_maps_and_were_before(env_name):
    config = build_config({"env": {"name": env_name, "val_envs": [env_name]}, "eval": {"instances": 64}})
    training = derive_seeds(7, 2000, "env_seeds")
    held = _maps(env_name, validation_seeds(config, env_name)) & _maps(
        env_name, split_seeds(env_name, {}, training, "train")
    )
    by_seed = build_config({**config.model_dump(mode="json"), "eval": {"instances": 64, "held_out": "seeds"}})
    assert held == set()
    # held out by seed alone, the same validation instances meet maps that training draws
    assert _maps(env_name, validation_seeds(by_seed, env_name)) & _maps(env_name, training)


def test_a_map_is_the_same_map_in_any_rendering():
    plain, coords = make_env("sokoban"), make_env("sokoban_coord")
    for seed in (3, 4, 5):
        plain.reset(seed)
        coords.reset(seed)
        assert plain.render() != coords.render() and plain.map_key() == coords.map_key()
    assert split_seeds("sokoban", {}, [3, 4, 5, 6], "val") == split_seeds("sokoban_coord", {}, [3, 4, 5, 6], "val")


def test_envs_without_maps_and_a_given_lake_play_their_seeds_as_given():
    assert split_seeds("bandit", {}, [1, 2, 3], "val") == [1, 2, 3]
    desc = ["SFFF", "FHFH", "FFFH", "HFFG"]
    assert split_seeds("frozen_lake", {"desc": desc}, [1, 2, 3], "val") == [1, 2, 3]


class OneRoom(TextEnv):
    """An env with one map only: it cannot hold a map out for validation."""

    name = "one_room"
    held_out_maps = True

    def reset(self, seed):
        return "#.#", {"success": False}

    def step(self, action):
        return "#.#", 0.0, True, False, {"success": False, "action_is_valid": True, "action_is_effective": False}

    def render(self):
        return "#.#"

    @property
    def action_names(self):
        return ["Stay"]

    def instruction(self):
        return "Stay."

    @property
    def success(self):
        return False

    def reward_bounds(self, max_actions):
        return 0.0, 0.0


def test_an_env_with_too_few_maps_says_how_to_validate_instead():
    side = "train" if _validation_side("tests.envs.test_held_out:OneRoom", 0) else "val"
    with pytest.raises(HeldOutError, match="eval.held_out=seeds"):
        split_seeds("tests.envs.test_held_out:OneRoom", {}, [0], side)


def test_the_engine_plays_and_stores_the_seeds_of_its_split(tiny_policy):
    _, tokenizer = tiny_policy
    from ragen_core.agent import ChatFormatter

    spec = RolloutSpec(
        env_name="sokoban",
        group_seeds=list(range(8)),
        group_size=1,
        max_turns=1,
        max_actions_per_turn=1,
        max_actions_per_traj=1,
        split="val",
    )
    records = run_rollouts(spec, ScriptedBackend("random", tokenizer), ChatFormatter(tokenizer), 0)
    assert [r.env_seed for r in records] == split_seeds("sokoban", {}, list(range(8)), "val")
    assert all(_validation_side("sokoban", r.env_seed) for r in records)


def test_runs_stored_before_the_key_keep_validating_on_held_out_seeds():
    assert build_config({}).eval.held_out == "maps"
    assert build_config(stored_config({"eval": {"instances": 8}})).eval.held_out == "seeds"
    assert build_config(stored_config({"eval": {"held_out": "maps"}})).eval.held_out == "maps"
