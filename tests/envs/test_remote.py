"""Envs over HTTP (``env.remote``, ``ragen env serve``), against real servers on loopback started as users start
them and stopped by PID: rollouts through a served env are, record for record, the same env's in this process
(scripted policies that ask for the teacher, the expert, descriptions, free-form answers and the env's own random
draws); a step sent again is never applied twice; a server that restarts mid-episode gets the episode rebuilt; a
dead server, an env that raises on the server and a server of another env are each one line naming the server and
the call."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, replace

import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.envs import env_factory, held_out, make_env
from ragen_core.envs.external import env_source
from ragen_core.envs.remote import RETRY_DELAYS, RemoteEnvError, open_env, served_env
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from tests.envs.env_servers import port_of, serve, stop

pytestmark = pytest.mark.process  # `ragen env serve` processes

SERVED = ("frozen_lake", "sokoban", "countdown", "bandit", "sudoku_pr147_4x4")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """One `ragen env serve NAME --port 0` per env of :data:`SERVED`: {name: URL}; stopped by PID after."""
    folder = tmp_path_factory.mktemp("env-servers")
    started = {name: serve(name, folder / f"{name}.log") for name in SERVED}
    yield {name: url for name, (_, url) in started.items()}
    for name, (process, _) in started.items():
        assert stop(process, signal.SIGINT) == 130  # Ctrl-C: a clean stop, as the viewer's
        assert "Traceback" not in (folder / f"{name}.log").read_text()


def _http(url: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


CASES = [  # env, scripted policy, (turns, actions per turn, actions per trajectory), held-out split
    ("frozen_lake", "expert", (4, 1, 4), "train"),  # maps split through the server; the teacher each turn
    ("frozen_lake", "teacher_mix", (3, 2, 5), "val"),  # teacher's moves, descriptions, the env's draws
    ("sokoban", "random", (3, 2, 5), None),
    ("countdown", "random", (1, 1, 1), None),  # free-form answers: the env's parse_action and sample_action
    ("bandit", "expert", (1, 1, 1), None),
    ("sudoku_pr147_4x4", "random", (2, 3, 6), None),
]


@pytest.mark.parametrize(("name", "policy", "limits", "split"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_rollouts_on_a_served_env_are_the_env_s_in_process(servers, tiny_policy, name, policy, limits, split):
    _, tokenizer = tiny_policy
    formatter, backend = ChatFormatter(tokenizer), ScriptedBackend(policy, tokenizer)
    spec = RolloutSpec(name, [3, 11, 12], 2, *limits, split=split)
    held_out._SPLITS.clear()  # each side splits the seeds itself: here with the env, there with the server's
    here = run_rollouts(spec, backend, formatter, seed=5)
    held_out._SPLITS.clear()
    there = run_rollouts(replace(spec, env_remote=servers[name], user_code_timeout_s=60.0), backend, formatter, 5)
    assert [asdict(record) for record in there] == [asdict(record) for record in here]
    assert len({record.env_seed for record in here}) == 3


def test_the_server_says_what_it_serves_in_openenv_s_shapes(servers):
    url = servers["frozen_lake"]
    assert url.startswith("http://127.0.0.1:")  # loopback by default
    assert _http(url, "/health") == (200, {"status": "healthy"})
    status, metadata = _http(url, "/metadata")
    assert status == 200 and metadata["name"] == "frozen_lake"
    status, schema = _http(url, "/schema")
    assert status == 200 and set(schema) == {"action", "observation", "state"}
    assert schema["action"]["properties"]["action"]["type"] == "string"
    served = served_env(url, 30)
    assert (served.name, served.options, served.held_out_maps) == ("frozen_lake", {}, True)
    assert {"teacher_actions", "describe", "expert_plan", "end_reason"} <= served.methods
    assert served.source == env_source("frozen_lake", env_factory("frozen_lake")).to_dict()  # as a run here says it


def test_a_session_socket_plays_one_episode_in_openenv_s_messages(servers):
    """``/ws``, as openenv-core's EnvClient speaks it: reset, step, state, close; errors as error messages."""
    from websockets.sync.client import connect

    local = make_env("frozen_lake")
    with connect(servers["frozen_lake"].replace("http://", "ws://") + "/ws", open_timeout=30) as socket:

        def send(message: dict) -> dict:
            socket.send(json.dumps(message))
            return json.loads(socket.recv(timeout=30))

        reset = send({"type": "reset", "data": {"seed": 6}})
        assert reset["type"] == "observation" and reset["data"]["observation"]["text"] == local.reset(6)[0]
        step = send({"type": "step", "data": {"action": "Right"}})
        text, reward, terminated, truncated, _ = local.step("Right")
        assert step["data"]["observation"]["text"] == text and step["data"]["reward"] == reward
        assert step["data"]["done"] == (terminated or truncated)
        assert send({"type": "state"})["data"]["step_count"] == 1
        assert send({"type": "step", "data": {}})["data"]["code"] == "VALIDATION_ERROR"
        assert send({"type": "dance"})["data"]["code"] == "UNKNOWN_TYPE"
        socket.send(json.dumps({"type": "close"}))


def test_a_step_sent_again_is_answered_from_its_record_never_applied_twice(servers):
    url = servers["sokoban"]
    status, reset = _http(url, "/reset", {"seed": 4, "episode_id": "e1"})
    assert status == 200 and reset["observation"]["episode_id"] == "e1" and reset["done"] is False
    step = {"action": {"action": "Up"}, "episode_id": "e1", "step_index": 0}
    first, again = _http(url, "/step", step), _http(url, "/step", step)
    assert first == again and first[0] == 200
    assert _http(url, "/state?episode_id=e1") == (200, {"episode_id": "e1", "step_count": 1})
    env = make_env("sokoban")
    env.reset(4)
    assert first[1]["observation"]["text"] == env.step("Up")[0]
    status, refused = _http(url, "/step", {**step, "action": {"action": "Down"}})  # step 0 again, another action
    assert status == 409 and "is at step_index 1, not 0" in refused["detail"]
    status, gone = _http(url, "/step", {**step, "episode_id": "nobody"})
    assert status == 410 and "no episode 'nobody'" in gone["detail"]
    status, bad = _http(url, "/step", {"action": "Up"})
    assert status == 422 and "episode_id must be str" in bad["detail"]


def test_an_episode_the_server_lost_is_rebuilt_from_its_seed_and_actions(tmp_path):
    process, url = serve("sokoban", tmp_path / "first.log")
    env, local = open_env("sokoban", {}, url, 30.0), make_env("sokoban")
    assert env.reset(9) == local.reset(9)
    moves = ["Up", "Left", "Down", "Right", "Up"]
    for action in moves[:2]:
        assert env.step(action) == local.step(action)
    stop(process, signal.SIGKILL)
    process, again = serve("sokoban", tmp_path / "second.log", port=port_of(url))  # the same port: SO_REUSEADDR
    try:
        assert again == url
        for action in moves[2:]:  # the new server holds no episode: rebuilt (reset 9, Up, Left) and stepped on
            assert env.step(action) == local.step(action)
        assert env.success == local.success and env.render() == local.render()
    finally:
        stop(process)


def test_a_dead_server_is_one_line_naming_it_and_the_call(tmp_path):
    process, url = serve("bandit", tmp_path / "bandit.log")
    env = open_env("bandit", {}, url, 30.0)
    env.reset(2)
    stop(process, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(RemoteEnvError) as caught:
        env.step(env.action_names[0])
    waited = time.monotonic() - started
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"the env server {url} is unreachable on POST /step")
    assert "(episode of env_seed 2, step_index 0)" in message and f"{len(RETRY_DELAYS)} tries" in message
    assert sum(RETRY_DELAYS) <= waited < sum(RETRY_DELAYS) + 10


RAISING_ENV = '''
import time

from ragen_core.envs import TextEnv


class Fragile(TextEnv):
    """Two doors: "left" wins; "right" breaks the env (it raises); "wait" hangs it."""

    def reset(self, seed):
        self.done = False
        return "Two doors.", {"success": False}

    def step(self, action):
        if action == "right":
            raise RuntimeError("the door fell off")
        if action == "wait":
            time.sleep(120)  # a hung env: the client stops waiting after its timeout
        self.done = True
        return "Out.", 1.0, True, False, {"success": True, "action_is_valid": True, "action_is_effective": True}

    def render(self):
        return "Out." if self.done else "Two doors."

    @property
    def action_names(self):
        return ["left", "right", "wait"]

    def instruction(self):
        return "Pick a door."

    @property
    def success(self):
        return self.done

    def reward_bounds(self, max_actions):
        return 0.0, 1.0
'''


def test_a_user_env_served_from_its_own_folder_and_its_errors(tmp_path):
    """The env's module is on the server's import path only: the client never imports it; what it raises on the
    server is the client's one line, with the env's own words."""
    (tmp_path / "doors_mod.py").write_text(RAISING_ENV)
    process, url = serve("doors_mod:Fragile", tmp_path / "doors.log", env={"PYTHONPATH": _on_path(tmp_path)})
    try:
        env = open_env("doors_mod:Fragile", {}, url, 30.0)
        assert env.reset(0) == ("Two doors.", {"success": False}) and env.reward_bounds(3) == (0.0, 1.0)
        with pytest.raises(RemoteEnvError) as caught:
            env.step("right")
        message = str(caught.value)
        assert message.startswith(f"the env server {url} answered POST /step (episode of env_seed 0, step_index 0)")
        assert "doors_mod:Fragile.step('right') raised RuntimeError: the door fell off" in message
        assert env.step("left") == ("Out.", 1.0, True, False, {**_valid(), "success": True})
        with pytest.raises(RemoteEnvError, match=r"serves doors_mod:Fragile with options \{\}, the run plays bandit"):
            open_env("bandit", {}, url, 30.0)
    finally:
        stop(process)


def test_a_server_that_does_not_answer_in_time_is_one_line_and_the_call_is_not_retried(tmp_path):
    (tmp_path / "doors_mod.py").write_text(RAISING_ENV)
    process, url = serve("doors_mod:Fragile", tmp_path / "doors.log", env={"PYTHONPATH": _on_path(tmp_path)})
    try:
        env = open_env("doors_mod:Fragile", {}, url, 1.5)
        env.reset(3)
        started = time.monotonic()
        with pytest.raises(RemoteEnvError) as caught:
            env.step("wait")
        waited = time.monotonic() - started
        assert str(caught.value) == (
            f"the env server {url} did not answer POST /step within 1.5 s (episode of env_seed 3, step_index 0): it "
            "may hang; if it only needs longer, raise env.user_code_timeout_s"
        )
        assert 1.5 <= waited < 1.5 + 5  # one wait, not one per retry
    finally:
        assert stop(process, signal.SIGKILL) == -signal.SIGKILL  # its env still sleeps: stopped by its PID


def _held(url: str) -> int:
    status, facts = _http(url, "/ragen/env")
    assert status == 200
    return facts["episodes"]["held"]


def test_a_run_s_resets_leave_on_the_server_only_the_episodes_being_played(tmp_path, tiny_policy):
    """A client releases its episode when it resets again, is closed or is garbage (named at the next reset): many
    resets, and a run's worth of rollouts, leave on the server only the episodes still played."""
    _, tokenizer = tiny_policy
    process, url = serve("bandit", tmp_path / "bandit.log")
    try:
        env = open_env("bandit", {}, url, 30.0)
        for seed in range(10):
            env.reset(seed)
        assert _held(url) == 1  # each reset released the episode before it
        env.close()
        spec = RolloutSpec("bandit", [1, 2, 3], 2, 1, 1, 1, env_remote=url, user_code_timeout_s=30.0)
        formatter, backend = ChatFormatter(tokenizer), ScriptedBackend("random", tokenizer)
        for iteration in range(4):
            assert len(run_rollouts(spec, backend, formatter, seed=iteration)) == 6
            assert _held(url) == 6  # this iteration's envs; the ones before were released at its first reset
    finally:
        stop(process)


def test_a_slow_call_of_one_episode_holds_up_no_other(tmp_path):
    """Episodes are independent envs: while one episode's step hangs on the server, another episode resets and
    steps, and the server answers its other routes."""
    (tmp_path / "doors_mod.py").write_text(RAISING_ENV)
    process, url = serve("doors_mod:Fragile", tmp_path / "doors.log", env={"PYTHONPATH": _on_path(tmp_path)})

    def hang() -> None:
        try:
            _http(url, "/step", {"action": {"action": "wait"}, "episode_id": "slow", "step_index": 0})
        except Exception:  # noqa: BLE001 - the server is killed under it
            pass

    try:
        assert _http(url, "/reset", {"seed": 0, "episode_id": "slow"})[0] == 200
        threading.Thread(target=hang, daemon=True).start()
        time.sleep(1.0)  # the slow episode's env now sleeps in its step
        started = time.monotonic()
        env = open_env("doors_mod:Fragile", {}, url, 5.0)  # one wait of the server's old lock: 5 s, then an error
        assert env.reset(1) == ("Two doors.", {"success": False})
        assert env.step("left")[1:3] == (1.0, True)
        assert _http(url, "/state?episode_id=slow") == (200, {"episode_id": "slow", "step_count": 0})
        assert time.monotonic() - started < 5
    finally:
        assert stop(process, signal.SIGKILL) == -signal.SIGKILL  # its env still sleeps: stopped by its PID


def test_a_loopback_server_answers_only_requests_for_a_loopback_host(servers):
    """DNS rebinding: a page of evil.example whose name comes to point at 127.0.0.1 reaches the port, not the env."""
    port = port_of(servers["bandit"])
    for host, expected in (("evil.example", 403), (f"evil.example:{port}", 403), (f"127.0.0.1:{port}", 200)):
        for path in ("/health", "/ragen/env"):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("GET", path, headers={"Host": host})
                assert connection.getresponse().status == expected, (host, path)
            finally:
                connection.close()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/health", headers={"Host": f"localhost:{port}"})
    assert connection.getresponse().status == 200
    connection.close()


def _on_path(folder) -> str:
    """``folder`` first on the server's import path (before this checkout's, where the tests run from one)."""
    return os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def _valid() -> dict:
    return {"action_is_valid": True, "action_is_effective": True}


def test_the_command_refuses_in_one_line_what_it_cannot_serve(tmp_path):
    from typer.testing import CliRunner

    from ragen_cli.main import app

    for args, expected in (
        (["env", "serve", "no_such_env"], "unknown environment 'no_such_env'"),
        (["env", "serve", "frozen_lake", "-o", "size=1e9"], "size"),
        (["env", "serve", "frozen_lake", "-o", "nothing"], "--option nothing: write key=value"),
        (["env", "serve", "frozen_lake", "--port", "70000"], "--port must be 0-65535"),
        (["env", "serve", "bandit", "--max-episodes", "0"], "--max-episodes must be at least 1, not 0"),
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (args, result.stderr)
