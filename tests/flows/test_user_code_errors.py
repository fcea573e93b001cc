"""A user's own reward function or environment that fails (issue 51, item 6), through the real CLI in a process of
its own: one that raises or returns the wrong type on the first rows is refused in one line at config time, before
the data root exists; one that fails later stops the run in one line naming the function, the row and the answer
(or the class, the call and its argument), and the manifest keeps that line; one that no reply ever reaches warns.

The user's code is written into a temporary folder and reaches the command through PYTHONPATH, as a user's would.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import time

import pytest

from ragen_core.envs.external import UserCodeError, env_reset, env_step
from ragen_core.findings.spec import REPO_ROOT
from ragen_core.storage import query
from tests.envs.user_code import unique, write_env_module
from tests.flows.test_resume import _overrides, _ragen

pytestmark = pytest.mark.process  # ragen train in a subprocess

REWARDS = '''
import sys
import threading

CALLS = [0]


def raises(completion, solution, **columns):
    return {"a": 1}["b"]


def text(completion, solution, **columns):
    return "1.0"


def exits(completion, solution, **columns):
    sys.exit(7)


def stuck(completion, solution, **columns):
    threading.Event().wait()  # never returns


def late(completion, solution, **columns):
    """Scores the config-time check's three rows, then divides by zero."""
    CALLS[0] += 1
    if CALLS[0] > 3:
        return 1 / 0
    return 1.0
'''

# the dataset example through the scripted expert (every reply is the row's answer, so every reply reaches the
# reward), one small iteration
DATASET = [
    "--config",
    "configs/dataset_arithmetic.yaml",
    "rollout.backend=scripted",
    "rollout.scripted_policy=expert",
    "bootstrap.enabled=false",
    "trainer.iterations=1",
    "rollout.env_groups=2",
    "rollout.group_size=2",
    "eval.instances=2",
    "actor.mini_batch_size=4",
    "actor.micro_batch_size=4",
    "trainer.num_threads=1",
]


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """A folder on PYTHONPATH (for the commands) holding the reward module, the repository's root beside it (the
    example's reward, as its config says); the folder and the module's name."""
    folder = tmp_path_factory.mktemp("user")
    name = unique("rewards")
    (folder / f"{name}.py").write_text(REWARDS)
    patch = pytest.MonkeyPatch()
    paths = (str(folder), str(REPO_ROOT), os.environ.get("PYTHONPATH"))
    patch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    yield folder, name
    patch.undo()


def _errors(output: str) -> list[str]:
    assert "Traceback" not in output and "[rank0]" not in output, output[-3000:]
    return [line for line in output.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(
    ("function", "said"),
    [
        ("raises", "raised KeyError: 'b' (the row's 'solution' scored)"),
        ("text", "returned '1.0': return a number, or (number, feedback text) (the row's 'solution' scored)"),
    ],
)
def test_a_reward_failing_on_the_first_rows_is_one_line_before_anything_exists(user, tmp_path, function, said):
    root = tmp_path / "root"
    root.mkdir()
    rc, output = _ragen(["train", *DATASET, f"env.options.reward_fn={user[1]}:{function}"], root)
    expected = (
        f"error: invalid config: env.options.reward_fn: reward function {user[1]}:{function} on row 1 of "
        f"examples/arithmetic/prompts.jsonl, answer '12', {said}"
    )
    assert rc == 2 and _errors(output) == [expected], output[-3000:]
    assert [p.name for p in root.iterdir()] == [".log-0.txt"]  # the CLI's own log of this test: nothing else


@pytest.mark.parametrize(
    ("function", "limit", "said"),
    [
        ("exits", [], ", called sys.exit(7): return a value, never exit"),
        (
            "stuck",
            ["env.user_code_timeout_s=1"],
            " did not return within 1 s: it may hang; if it only needs longer, raise env.user_code_timeout_s",
        ),
    ],
)
def test_a_reward_that_exits_or_never_returns_is_one_line_not_an_exit_or_a_hang(user, tmp_path, function, limit, said):
    # issue 66: sys.exit(7) in the reward ended the command with status 7 and no word; one that never returned hung
    root = tmp_path / "root"
    root.mkdir()
    started = time.monotonic()
    rc, output = _ragen(["train", *DATASET, f"env.options.reward_fn={user[1]}:{function}", *limit], root)
    expected = (
        f"error: invalid config: env.options.reward_fn: reward function {user[1]}:{function} on row 1 of "
        f"examples/arithmetic/prompts.jsonl, answer '12'{said} (the row's 'solution' scored)"
    )
    assert rc == 2 and _errors(output) == [expected], output[-3000:]
    assert time.monotonic() - started < 120  # the stuck call abandoned: the command ends at once after its line
    assert [p.name for p in root.iterdir()] == [".log-0.txt"]


def test_a_reward_failing_during_the_run_is_one_line_and_the_run_records_it(user, tmp_path, prefect_server):
    rc, output = _ragen(
        ["train", *DATASET, f"env.options.reward_fn={user[1]}:late", "--run-id", "late"],
        tmp_path,
        api_url=prefect_server[0].api_url,
    )
    lines = _errors(output)
    assert rc != 0 and len(lines) == 1, output[-3000:]
    # the fourth call: the first training trajectory's answer; the seeds draw the rows, so the row is read back
    assert lines[0].startswith(f"error: reward function {user[1]}:late on row ")
    assert lines[0].endswith("raised ZeroDivisionError: division by zero")
    row = int(lines[0].split(" on row ")[1].split()[0])
    prompts = [json.loads(line) for line in open("examples/arithmetic/prompts.jsonl")]  # noqa: SIM115
    assert f"answer '{prompts[row - 1]['solution']}'," in lines[0]
    manifest = json.loads((tmp_path / "runs" / "late" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and lines[0].removeprefix("error: ") in json.dumps(manifest)


def test_a_reward_no_reply_reaches_is_warned_about(user, tmp_path, tiny_model_dir, prefect_server):
    # the untrained tiny model's replies never end within 12 tokens: none reaches the example's reward function
    overrides = [o for o in DATASET if not o.startswith(("rollout.backend", "rollout.scripted"))]
    rc, output = _ragen(
        ["train", *overrides, f"model.path={tiny_model_dir}", "--run-id", "mute"],
        tmp_path,
        api_url=prefect_server[0].api_url,
    )
    assert rc == 0, output[-3000:]
    warning = "no training reply reached the reward function examples.arithmetic.reward:score"
    assert warning in output
    events = query(tmp_path, "SELECT iteration, message FROM events WHERE kind = 'early_warning'").to_pylist()
    assert [e["iteration"] for e in events if warning in e["message"]] == [0]


# -- an environment of the user's own ---------------------------------------------------------------------------


BROKEN = """
import threading

from {module} import CoinEnv


class RaisingEnv(CoinEnv):
    def step(self, action):
        raise RuntimeError("the board fell over")


class ListEnv(CoinEnv):
    def step(self, action):
        return list(super().step(action))


class ResetEnv(CoinEnv):
    def reset(self, seed):
        return self.render()


class StuckEnv(CoinEnv):
    def step(self, action):
        threading.Event().wait()  # never returns


class HugeEnv(CoinEnv):
    def render(self):
        return "x" * (10 * 2**20)  # a state of 10 MB
"""


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    """The coin env of tests/envs/user_code.py and three broken variants, importable here and by the commands."""
    folder = tmp_path_factory.mktemp("user-envs")
    coin = write_env_module(folder, unique("coin_envs")).split(":")[0]
    broken = unique("broken_envs")
    (folder / f"{broken}.py").write_text(textwrap.dedent(BROKEN.format(module=coin)))
    patch = pytest.MonkeyPatch()
    patch.syspath_prepend(str(folder))
    patch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p))
    yield broken
    patch.undo()


def test_a_users_env_that_raises_or_returns_the_wrong_shape_is_one_line_naming_the_call(envs):
    import importlib

    module = importlib.import_module(envs)
    env = module.RaisingEnv()
    assert env_reset(env, 3) == ("The coin shows tails.", {"success": False})
    with pytest.raises(UserCodeError) as caught:
        env_step(env, "heads")
    assert str(caught.value) == (
        f"environment {envs}:RaisingEnv.step('heads') raised RuntimeError: the board fell over"
    )
    assert isinstance(caught.value.__cause__, RuntimeError)  # the user's traceback, for the API's callers
    env = module.ListEnv()
    env_reset(env, 0)
    with pytest.raises(UserCodeError, match=r"ListEnv\.step\('tails'\) returned \['Done\.', 0\.0, True, False, "):
        env_step(env, "tails")
    with pytest.raises(UserCodeError, match=r"ResetEnv\.reset\(5\) returned .*: return \(observation text, info"):
        env_reset(module.ResetEnv(), 5)


def test_a_users_env_raising_in_a_run_is_one_line(envs, tmp_path, tiny_model_dir, prefect_server):
    name = f"{envs}:RaisingEnv"
    overrides = [o for o in _overrides(tiny_model_dir) if not o.startswith("env.")]
    overrides += [
        f"env.name={name}",
        f"env.val_envs=[{name}]",
        "rollout.backend=scripted",
        "rollout.scripted_policy=expert",
    ]
    rc, output = _ragen(
        ["train", "--config", "configs/bandit.yaml", "--run-id", "raising", *overrides],
        tmp_path,
        api_url=prefect_server[0].api_url,
    )
    lines = _errors(output)
    assert rc != 0 and len(lines) == 1, output[-3000:]
    assert lines[0].startswith(f"error: environment {name}.step('"), lines
    assert lines[0].endswith("') raised RuntimeError: the board fell over"), lines
    manifest = json.loads((tmp_path / "runs" / "raising" / "manifest.json").read_text())
    assert manifest["status"] == "failed"


@pytest.mark.parametrize(
    ("env_class", "limit", "said"),
    [
        (
            "StuckEnv",
            ["env.user_code_timeout_s=1"],
            r"environment {name}\.step\('(heads|tails)'\) did not return within 1 s \(env {name}, env_seed \d+, "
            r"group_id \d+, traj_index \d+, turn_index 0\): it may hang; if it only needs longer, raise "
            r"env\.user_code_timeout_s",
        ),
        (
            "HugeEnv",
            [],
            r"the prompt of turn_index 0 \(env {name}, env_seed \d+, group_id 0, traj_index 0\) would be [\d,]+ "
            r"characters, more than the model's context of 4,096 tokens can hold .*: the env's text is too long for "
            r"the model; .*",
        ),
    ],
)
def test_a_users_env_that_hangs_or_floods_the_prompt_fails_the_run_in_one_line(
    envs, tmp_path, tiny_model_dir, prefect_server, env_class, limit, said
):
    # issue 66: a step that never returned hung the run silently; a 10 MB state became a 10-million-token prompt
    name = f"{envs}:{env_class}"
    overrides = [o for o in _overrides(tiny_model_dir) if not o.startswith("env.")]
    overrides += [f"env.name={name}", f"env.val_envs=[{name}]", "rollout.backend=scripted", *limit]
    overrides += ["rollout.scripted_policy=expert"]
    started = time.monotonic()
    rc, output = _ragen(
        ["train", "--config", "configs/bandit.yaml", "--run-id", "stuck", *overrides],
        tmp_path,
        api_url=prefect_server[0].api_url,
    )
    lines = _errors(output)
    assert rc != 0 and len(lines) == 1, output[-3000:]
    assert re.fullmatch("error: " + said.format(name=re.escape(name)), lines[0]), lines
    assert time.monotonic() - started < 300  # it ends: the stuck call is abandoned as the command exits
    manifest = json.loads((tmp_path / "runs" / "stuck" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and lines[0].removeprefix("error: ") in json.dumps(manifest)
    assert query(tmp_path, "SELECT count(*) AS n FROM trajectories").to_pylist() == [{"n": 0}]  # the lake reads
