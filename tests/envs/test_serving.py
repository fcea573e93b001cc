"""The env server's episodes (``ragen_core.envs.serving.EnvServer``), called as its routes call them: one fresh env
per reset, a step applied once whatever is sent again, an episode let go when its client releases it or beyond
the server's capacity, the calls
that take an argument, the env's own random draws with the client's generator (over the HTTP routes:
tests/envs/test_remote.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ragen_core.envs import make_env
from ragen_core.envs.remote import CONFLICT, GONE, OPTIONAL_METHODS
from ragen_core.envs.serving import EnvServer, Refused, jsonable


def test_each_reset_is_a_fresh_env_and_a_step_sent_again_is_applied_once():
    server, local = EnvServer("sokoban"), make_env("sokoban")
    first = server.reset(4, "a")
    assert first["observation"]["text"] == local.reset(4)[0] and first["reward"] is None
    assert first["observation"]["instruction"] == local.instruction() and first["observation"]["step_index"] == 0
    stepped = server.step("a", "Up", 0)
    assert server.step("a", "Up", 0) is stepped  # sent again: its record, not a second step
    text, reward, terminated, truncated, _ = local.step("Up")
    observed = (stepped["observation"]["text"], stepped["reward"], stepped["done"])
    assert observed == (text, reward, terminated or truncated)
    assert server.state("a") == {"episode_id": "a", "step_count": 1}
    with pytest.raises(Refused) as conflict:
        server.step("a", "Down", 0)  # index 0 again with another action: never applied
    assert conflict.value.status == CONFLICT and server.state("a")["step_count"] == 1
    with pytest.raises(Refused) as ahead:
        server.step("a", "Up", 5)
    assert ahead.value.status == CONFLICT
    assert server.reset(4, "a")["observation"]["text"] == first["observation"]["text"]  # reset again: the same


def test_episodes_beyond_the_capacity_are_let_go_oldest_first():
    server = EnvServer("bandit", capacity=2)
    for episode in ("a", "b", "c"):
        server.reset(1, episode)
    with pytest.raises(Refused) as gone:
        server.state("a")
    assert gone.value.status == GONE and "no episode 'a'" in gone.value.message
    assert server.state("c")["step_count"] == 0
    server.drop("c")
    with pytest.raises(Refused):
        server.state("c")


def test_a_reset_lets_go_the_episodes_its_client_is_done_with():
    server = EnvServer("bandit")
    for episode in ("a", "b"):
        server.reset(1, episode)
    server.reset(2, "c", release=["a", "b", "never-held"])  # an id the server does not hold is nothing
    assert server.held == 1 and server.facts()["episodes"] == {"held": 1, "capacity": server.capacity}
    with pytest.raises(Refused) as gone:
        server.step("a", "Arm1", 0)
    assert gone.value.status == GONE


def test_what_the_server_serves_and_the_methods_it_asks_the_env():
    assert EnvServer("bandit").facts()["methods"] == ["expert_plan", "end_reason"]
    facts = EnvServer("frozen_lake", {"size": 5}).facts()
    assert facts["env"] == "frozen_lake" and facts["options"] == {"size": 5} and facts["held_out_maps"] is True
    assert set(facts["methods"]) <= set(OPTIONAL_METHODS) and "teacher_actions" in facts["methods"]
    with pytest.raises(ValueError, match="does not take the option"):
        EnvServer("bandit", {"nope": 1})
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        EnvServer("nope")
    with pytest.raises(ValueError, match="calculator is a tool env, played in the run's process only"):
        EnvServer("calculator")  # its tools are not on the wire: a client would play it as text


def test_calls_with_an_argument_are_the_env_s_own_answers():
    server, local = EnvServer("frozen_lake"), make_env("frozen_lake")
    server.reset(8, "a")
    local.reset(8)
    assert server.call("teacher_actions", 6, "a", 0) == {"value": local.teacher_actions(6)}
    assert server.call("expert_plan", 6, "a", 0) == {"value": list(local.expert_plan(6))}
    assert server.call("reward_bounds", 10, None, None) == {"value": list(local.reward_bounds(10))}
    with pytest.raises(Refused) as stale:
        server.call("teacher_actions", 6, "a", 3)  # the client thinks the episode is elsewhere
    assert stale.value.status == CONFLICT
    with pytest.raises(Refused, match="unknown call 'step'"):
        server.call("step", "Left", "a", 0)


def test_the_env_s_random_draws_use_the_client_s_generator_and_advance_it():
    server, local = EnvServer("countdown"), make_env("countdown")  # its own sample_action: a random equation
    server.reset(3, "a")
    local.reset(3)
    mine, theirs = np.random.default_rng(11), np.random.default_rng(11)
    for _ in range(3):
        state = json.loads(json.dumps(theirs.bit_generator.state))  # as it crosses the wire
        answer = json.loads(json.dumps(server.call("sample_action", state, "a", 0)))
        theirs.bit_generator.state = answer["rng"]
        assert answer["value"] == local.sample_action(mine)
    assert theirs.integers(1 << 30) == mine.integers(1 << 30)
    with pytest.raises(Refused, match="numpy bit generator"):
        server.call("sample_action", {"bit_generator": "Evil"}, "a", 0)


def test_what_an_env_raises_is_one_line_naming_it():
    server = EnvServer("countdown")
    with pytest.raises(Refused) as caught:
        server.reset(-1, "a")  # countdown draws from numpy, which refuses a negative seed
    assert caught.value.status == 500 and caught.value.message.startswith("environment countdown reset(-1) raised")
    assert "\n" not in caught.value.message


def test_jsonable_gives_json_s_types():
    value = {"a": np.int64(3), 1: (np.float32(0.5), np.bool_(True)), "b": [np.array([1, 2])], "c": None}
    assert jsonable(value) == {"a": 3, "1": [0.5, True], "b": [[1, 2]], "c": None}
    assert json.loads(json.dumps(jsonable(value))) == jsonable(value)


def test_the_client_asks_the_server_for_each_optional_method_it_can_define():
    from ragen_core.envs.base import TextEnv
    from ragen_core.envs.remote import RemoteEnv, _Asked, remote_class

    assert set(OPTIONAL_METHODS) <= set(vars(_Asked)) and all(hasattr(TextEnv, name) for name in OPTIONAL_METHODS)
    assert remote_class(frozenset()) is RemoteEnv
    frozen = remote_class(frozenset(EnvServer("frozen_lake").methods))
    assert frozen.teacher_actions is not TextEnv.teacher_actions and frozen.parse_action is TextEnv.parse_action
    assert frozen.__module__ == "ragen_core.envs.remote"  # the project's code: the rollouts call it directly
