"""The user's own code that never returns, exits the process or returns numpy's numbers or a non-finite reward
(issue 66, items 1-3): a step or reward that hangs fails the rollout in one line naming the code and its rollout row
within ``env.user_code_timeout_s``, and Ctrl-C still stops the wait; ``sys.exit(7)`` is one line naming the code;
``np.int64`` / ``np.float32`` rewards are numbers, converted exactly; an infinite or NaN reward is one line at the
step.

The stuck code waits on an event that nothing but the test sets (no exception from outside its thread can reach it,
and it takes no CPU while it waits, as a spin would for the whole limit), so no abandoned thread outlives its test.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ragen_core import stops
from ragen_core.config import ConfigError
from ragen_core.config.loading import build_config
from ragen_core.config.tree import LATER_KEYS, PLACEMENT_KEYS
from ragen_core.envs import make_env
from ragen_core.envs.external import UserCodeError, env_reset, env_step
from ragen_core.envs.watchdog import Overran, Watchdog
from ragen_core.rollout import ScriptedBackend, run_rollouts
from ragen_core.run.checks import build_run_config
from ragen_core.run.stages import rollout_spec
from tests.envs.user_code import unique, write_env_module

USER_CODE = '''
import sys
import threading

import numpy as np

from {coin} import CoinEnv

RELEASE = threading.Event()  # the test sets it: the stuck code then returns


def _spin():
    RELEASE.wait()  # no thread but its own can end the wait early: it returns when the test sets the event


class StuckEnv(CoinEnv):
    def step(self, action):
        _spin()
        return super().step(action)


class StuckResetEnv(CoinEnv):
    def reset(self, seed):
        _spin()
        return super().reset(seed)


class ExitEnv(CoinEnv):
    def step(self, action):
        sys.exit(7)


class NumpyEnv(CoinEnv):
    """Rewards and flags as numpy's scalars: np.float32(0.1) for the right side, np.int64(2) otherwise."""

    def step(self, action):
        text, reward, terminated, truncated, info = super().step(action)
        number = np.float32(0.1) if reward else np.int64(2)
        return text, number, np.bool_(terminated), np.bool_(truncated), info

    def reward_bounds(self, max_actions):
        return 0.0, 2.0


class InfEnv(CoinEnv):
    def step(self, action):
        text, _, terminated, truncated, info = super().step(action)
        return text, float("inf"), terminated, truncated, info


class NanEnv(CoinEnv):
    def step(self, action):
        text, _, terminated, truncated, info = super().step(action)
        return text, np.float64("nan"), terminated, truncated, info


def stuck(completion, solution, **columns):
    _spin()
    return 1.0


def exits(completion, solution, **columns):
    sys.exit(7)


def as_int64(completion, solution, **columns):
    return np.int64(completion == str(solution))


def as_float32(completion, solution, **columns):
    return np.float32(0.1), "numpy feedback"


def nan_score(completion, solution, **columns):
    return float("nan")


def inf_score(completion, solution, **columns):
    return np.float64("inf"), "infinitely good"
'''
ROWS = [{"prompt": "2 + 3 = ?", "solution": 5}, {"prompt": "9 + 9 = ?", "solution": 18}]


@pytest.fixture
def user(tmp_path, monkeypatch):
    """The user's module (envs and reward functions) importable, the rows as JSONL; the stuck code released after
    the test."""
    coin = write_env_module(tmp_path, unique("coin_envs")).split(":")[0]
    module = unique("user_limits")
    (tmp_path / f"{module}.py").write_text(USER_CODE.format(coin=coin))
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    code = __import__(module)
    yield {"module": module, "rows": str(rows), "code": code}
    code.RELEASE.set()


def _spec(env: str, timeout: float | None, seeds: tuple[int, ...] = (3,), **options):
    """The run's rollout spec (:func:`ragen_core.run.stages.rollout_spec`) of a config with the time limit."""
    overrides = [f"env.name={env}", f"env.user_code_timeout_s={'null' if timeout is None else timeout}"]
    overrides += [f"env.options.{key}={value}" for key, value in options.items()]
    return rollout_spec(build_config(overrides=overrides), env, list(seeds), 1, "train")


def _roll_out(spec, tokenizer, within: float = 30.0):
    """``run_rollouts`` with the scripted expert, on a thread of its own that must finish within ``within``
    seconds: a rollout that hangs fails the test instead of hanging it. Returns (its records or None, what it
    raised, the seconds it took)."""
    result: dict = {}

    def work():
        try:
            result["records"] = run_rollouts(spec, ScriptedBackend("expert", tokenizer), _formatter(tokenizer), 0)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            result["error"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(within)
    assert not thread.is_alive(), f"the rollout still ran after {within} s: it hangs"
    return result.get("records"), result.get("error"), time.monotonic() - started


def _formatter(tokenizer):
    from ragen_core.agent import ChatFormatter

    return ChatFormatter(tokenizer)


def test_an_env_step_that_never_returns_fails_the_rollout_in_one_line_naming_its_row(user, tiny_policy):
    name = f"{user['module']}:StuckEnv"
    _, error, seconds = _roll_out(_spec(name, 0.5), tiny_policy[1])
    assert isinstance(error, UserCodeError), error
    # seed 3 shows tails, which the expert names; the first trajectory is the first stepped
    assert str(error) == (
        f"environment {name}.step('tails') did not return within 0.5 s (env {name}, env_seed 3, group_id 0, "
        "traj_index 0, turn_index 0): it may hang; if it only needs longer, raise env.user_code_timeout_s"
    )
    assert seconds < 10  # the limit, not the spin, ended it
    user["code"].RELEASE.set()  # the abandoned call returns and its thread ends


def test_a_reset_that_never_returns_is_named_at_its_row(user):
    env = make_env(f"{user['module']}:StuckResetEnv")
    with pytest.raises(UserCodeError) as caught:
        env_reset(env, 8, Watchdog(0.2), lambda: "env x, env_seed 8")
    assert str(caught.value) == (
        f"environment {user['module']}:StuckResetEnv.reset(8) did not return within 0.2 s (env x, env_seed 8): it "
        "may hang; if it only needs longer, raise env.user_code_timeout_s"
    )


def test_a_reward_function_that_never_returns_fails_the_rollout_in_one_line(user, tiny_policy):
    options = {"data_file": user["rows"], "reward_fn": f"{user['module']}:stuck", "answer_column": "solution"}
    _, error, _ = _roll_out(_spec("dataset", 0.5, (1,), **options), tiny_policy[1])
    assert isinstance(error, UserCodeError), error
    assert str(error) == (
        f"reward function {user['module']}:stuck on row 2 of {user['rows']}, answer '18' did not return within "
        "0.5 s (env dataset, env_seed 1, group_id 0, traj_index 0, turn_index 0): it may hang; if it only needs "
        "longer, raise env.user_code_timeout_s"
    )


def test_a_reward_function_that_never_returns_is_refused_at_config_time(user):
    overrides = [
        "env.name=dataset",
        f"env.options.data_file={user['rows']}",
        f"env.options.reward_fn={user['module']}:stuck",
        "env.options.answer_column=solution",
        "env.user_code_timeout_s=0.5",
    ]
    with pytest.raises(ConfigError) as caught:
        build_run_config(overrides=overrides)
    assert str(caught.value).splitlines()[-1].strip() == (
        f"env.options.reward_fn: reward function {user['module']}:stuck on row 1 of {user['rows']}, answer '5' did "
        "not return within 0.5 s: it may hang; if it only needs longer, raise env.user_code_timeout_s (the row's "
        "'solution' scored)"
    )


def test_ctrl_c_stops_the_wait_for_a_call_that_never_returns(user, tmp_path):
    """A real Ctrl-C (SIGINT to a process whose main thread waits for the stuck call) ends the wait at once, in a
    process of its own (a pytest-xdist worker ignores SIGINT); a stop whose exception went elsewhere (recorded by a
    command's handler) ends it too."""
    script = (
        "import sys, time\n"
        "from ragen_core.envs import make_env\n"
        "from ragen_core.envs.external import env_reset, env_step\n"
        "from ragen_core.envs.watchdog import Watchdog\n"
        f"env = make_env({user['module'] + ':StuckEnv'!r})\n"
        "env_reset(env, 3)\n"
        "print('waiting', flush=True)\n"
        "started = time.monotonic()\n"
        "try:\n"
        "    env_step(env, 'tails', Watchdog(600.0))\n"
        "except KeyboardInterrupt:\n"
        "    print(f'stopped after {time.monotonic() - started:.2f} s', flush=True)\n"
    )
    repo = str(Path(__file__).resolve().parents[2])
    paths = os.pathsep.join([str(tmp_path), repo, os.environ.get("PYTHONPATH", "")])
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": paths}
    )
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        said, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert said.startswith("stopped after ") and float(said.split()[2]) < 5, said  # at once, not at 600 s
    env = make_env(f"{user['module']}:StuckEnv")
    env_reset(env, 3)
    recorder = threading.Timer(0.3, stops.request)
    recorder.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            env_step(env, "tails", Watchdog(30.0))
    finally:
        recorder.cancel()
        stops.clear()


def test_an_env_that_calls_sys_exit_is_one_line_naming_it(user):
    env = make_env(f"{user['module']}:ExitEnv")
    env_reset(env, 3)
    with pytest.raises(UserCodeError) as caught:  # as the engine called it before it had a limit: in its own thread
        env_step(env, "tails")
    called = f"environment {user['module']}:ExitEnv.step('tails') called sys.exit(7)"
    assert str(caught.value) == f"{called}: return a value, never exit"
    assert isinstance(caught.value.__cause__, SystemExit) and caught.value.__cause__.code == 7
    with pytest.raises(UserCodeError) as caught:  # under a limit (a thread of its own), with the row
        env_step(env, "tails", Watchdog(30.0), lambda: "env e, env_seed 3, turn_index 0")
    assert str(caught.value) == f"{called} (env e, env_seed 3, turn_index 0): return a value, never exit"


def test_a_reward_that_calls_sys_exit_is_one_line_naming_it(user, tiny_policy):
    options = {"data_file": user["rows"], "reward_fn": f"{user['module']}:exits", "answer_column": "solution"}
    expected = (
        f"reward function {user['module']}:exits on row 1 of {user['rows']}, answer '5', called sys.exit(7): return "
        "a value, never exit"
    )
    env = make_env("dataset", **options)
    env.reset(0)
    with pytest.raises(UserCodeError) as caught:
        env.step("5")
    assert str(caught.value) == expected
    _, error, _ = _roll_out(_spec("dataset", 30.0, (0,), **options), tiny_policy[1])  # through a rollout
    assert isinstance(error, UserCodeError) and str(error) == expected
    with pytest.raises(ConfigError) as refused:  # and at config time, on the first rows
        build_run_config(overrides=["env.name=dataset", *(f"env.options.{k}={v}" for k, v in options.items())])
    assert str(refused.value).splitlines()[-1].strip() == (
        f"env.options.reward_fn: {expected} (the row's 'solution' scored)"
    )


def _float32_as_python(value: float) -> float:
    """The float64 a float32 holds, from its bytes (independent of numpy's conversion)."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def test_numpy_rewards_and_flags_of_a_users_env_are_numbers_converted_exactly(user):
    env = make_env(f"{user['module']}:NumpyEnv")
    env_reset(env, 3)
    text, reward, terminated, truncated, info = env_step(env, "tails")
    assert (text, terminated, truncated, info["success"]) == ("Done.", True, False, True)
    assert type(reward) is float and reward == _float32_as_python(0.1) == 0.10000000149011612
    assert type(terminated) is bool and type(truncated) is bool
    env_reset(env, 3)
    reward = env_step(env, "heads")[1]
    assert reward == 2.0 and type(reward) is float


def test_numpy_rewards_of_a_reward_function_are_numbers(user):
    options = {"data_file": user["rows"], "answer_column": "solution"}
    env = make_env("dataset", reward_fn=f"{user['module']}:as_int64", **options)
    env.check_reward()  # the config-time check takes them too
    env.reset(1)
    assert env.step("18")[1:3] == (1.0, True)
    env = make_env("dataset", reward_fn=f"{user['module']}:as_float32", **options)
    env.reset(0)
    state, reward, *_ = env.step("4")
    assert reward == _float32_as_python(0.1) and type(reward) is float
    assert state == "2 + 3 = ?\nFeedback: numpy feedback"


@pytest.mark.parametrize(("env_class", "shown"), [("InfEnv", "inf"), ("NanEnv", "nan")])
def test_a_non_finite_reward_is_one_line_at_the_step(user, tiny_policy, env_class, shown):
    name = f"{user['module']}:{env_class}"
    env = make_env(name)
    env_reset(env, 4)
    with pytest.raises(UserCodeError) as caught:
        env_step(env, "heads")
    assert (
        str(caught.value)
        == f"environment {name}.step('heads') returned the reward {shown}: a reward is a finite number"
    )
    _, error, _ = _roll_out(_spec(name, 30.0, (4,)), tiny_policy[1])
    assert isinstance(error, UserCodeError), error
    assert str(error) == (
        f"environment {name}.step('heads') returned the reward {shown} (env {name}, env_seed 4, group_id 0, "
        "traj_index 0, turn_index 0): a reward is a finite number"
    )


@pytest.mark.parametrize(
    ("function", "shown"), [("nan_score", "nan"), ("inf_score", "(np.float64(inf), 'infinitely good')")]
)
def test_a_non_finite_score_is_one_line_naming_the_function(user, function, shown):
    env = make_env(
        "dataset", data_file=user["rows"], reward_fn=f"{user['module']}:{function}", reward_range=[0, "inf"]
    )
    env.reset(0)
    with pytest.raises(UserCodeError) as caught:
        env.step("5")
    assert str(caught.value) == (
        f"reward function {user['module']}:{function} on row 1 of {user['rows']}, answer '5', returned {shown}: a "
        "score is a finite number"
    )


def test_the_time_limit_is_a_config_key_out_of_the_hash_at_its_default():
    default = build_config()
    assert default.env.user_code_timeout_s == 300.0
    # the hash of the tree without the key (and the other later keys at their neutral values), as before it existed
    tree = default.to_dict()
    for dotted in (*LATER_KEYS, *PLACEMENT_KEYS):  # and where the processes meet, at any value
        *sections, name = dotted.split(".")
        node = tree
        for section in sections:
            node = node[section]
        del node[name]
    payload = json.dumps(tree, sort_keys=True, separators=(",", ":")).encode()
    assert default.config_hash() == hashlib.sha256(payload).hexdigest()[:16]
    assert build_config(overrides=["env.user_code_timeout_s=5"]).config_hash() != default.config_hash()
    assert build_config(overrides=["env.user_code_timeout_s=null"]).env.user_code_timeout_s is None
    for bad in ("0", "-1", "1e9"):
        with pytest.raises(ConfigError, match="env.user_code_timeout_s"):
            build_config(overrides=[f"env.user_code_timeout_s={bad}"])


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ragen-user-code"]


def test_a_watchdog_keeps_one_worker_and_replaces_one_it_abandoned(user):
    before = set(_workers())
    with Watchdog(5.0) as watchdog:
        assert [watchdog.call(lambda x: x * 2, n) for n in range(20)] == [(True, 2 * n) for n in range(20)]
        assert len(set(_workers()) - before) == 1  # one worker served the twenty calls
        failed = watchdog.call(lambda _: sys.exit(3), None)
        assert failed[0] is False and isinstance(failed[1], SystemExit)  # handed back, the worker lives on
    stuck = Watchdog(0.2)
    with pytest.raises(Overran):
        stuck.call(lambda _: user["code"]._spin(), None)
    assert stuck.call(lambda x: x + 1, 1) == (True, 2)  # a fresh worker beside the abandoned one
    stuck.close()
    user["code"].RELEASE.set()
    deadline = time.monotonic() + 10
    while set(_workers()) - before and time.monotonic() < deadline:  # every worker ends once its call is done
        time.sleep(0.05)
    assert not set(_workers()) - before
