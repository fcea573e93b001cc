"""``ragen env serve`` speaks OpenEnv's protocol, checked against the real openenv-core package (0.3.0, pinned in the
``dev`` extra; a test-only dependency: docs/environments.md, "Environments over HTTP"): openenv-core's own client
plays a served env over its session socket; the served answers are valid instances of openenv-core's response models
and a run's requests of its request models; and openenv-core's own server (``HTTPEnvServer``), hosting a served env's
episodes, is played by a run's client, rollouts equal to the env's in process."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from dataclasses import asdict, replace
from typing import Any

import pytest
from openenv.core.env_server import types as openenv_types

from ragen_core.agent import ChatFormatter
from ragen_core.envs import held_out, make_env
from ragen_core.envs.serving import EnvServer, Refused
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts
from tests.envs.env_servers import serve, stop

pytestmark = pytest.mark.process  # `ragen env serve` processes


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    process, url = serve("frozen_lake", tmp_path_factory.mktemp("openenv") / "server.log")
    yield url
    stop(process)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _post(url: str, body: dict) -> Any:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_openenv_s_own_client_plays_a_served_env(served):
    from openenv.core.generic_client import GenericEnvClient

    local = make_env("frozen_lake")
    with GenericEnvClient(base_url=served).sync() as client:
        result = client.reset(seed=6)
        assert result.observation["text"] == local.reset(6)[0] and result.done is False
        for action in ("Right", "Down", "Down"):
            result = client.step({"action": action})
            text, reward, terminated, truncated, _ = local.step(action)
            assert (result.observation["text"], result.reward, result.done) == (text, reward, terminated or truncated)
            if result.done:
                break


def test_the_served_answers_are_openenv_s_models_and_a_run_s_requests_too(served):
    types = openenv_types
    types.HealthResponse.model_validate(_get(served + "/health"))
    types.EnvironmentMetadata.model_validate(_get(served + "/metadata"))
    types.SchemaResponse.model_validate(_get(served + "/schema"))
    reset_body = {"seed": 6, "episode_id": "compat"}  # as RemoteEnv sends them
    step_body = {"action": {"action": "Right"}, "episode_id": "compat", "step_index": 0}
    types.ResetRequest.model_validate(reset_body)
    types.StepRequest.model_validate(step_body)
    types.ResetResponse.model_validate(_post(served + "/reset", reset_body))
    types.StepResponse.model_validate(_post(served + "/step", step_body))
    types.State.model_validate(_get(served + "/state?episode_id=compat"))


def _openenv_app(store: EnvServer) -> Any:
    """openenv-core's own server (``HTTPEnvServer``'s routes on a FastAPI app) hosting ``store``'s episodes through
    an openenv ``Environment``, with the two routes of ours a run also asks."""
    from fastapi import FastAPI, HTTPException
    from openenv.core.env_server.http_server import HTTPEnvServer
    from openenv.core.env_server.interfaces import Environment
    from pydantic import create_model

    from ragen_core.envs import serving

    class Action(openenv_types.Action):
        action: str

    fields = {name: (info.annotation, info) for name, info in serving.TextObservation.model_fields.items()}
    observation = create_model("TextObservation", __base__=openenv_types.Observation, **fields)

    def answered(call, *arguments) -> Any:
        try:
            answer = call(*arguments)
        except Refused as exc:
            raise HTTPException(status_code=exc.status, detail=exc.message) from None
        return observation(**answer["observation"], reward=answer["reward"], done=answer["done"])

    class Hosted(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def reset(self, seed=None, episode_id=None, **kwargs):
            return answered(store.reset, seed, episode_id)

        def step(self, action, timeout_s=None, episode_id=None, step_index=None, **kwargs):
            return answered(store.step, episode_id, action.action, step_index)

        @property
        def state(self):
            return openenv_types.State()

    app = FastAPI()
    HTTPEnvServer(Hosted, Action, observation, max_concurrent_envs=4).register_routes(app)
    app.add_route("/ragen/env", serving._facts)
    app.add_route("/ragen/call", serving._call, methods=["POST"])
    app.state.env = store
    return app


def test_a_run_s_client_plays_openenv_s_own_server(tiny_policy):
    import uvicorn

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(_openenv_app(EnvServer("frozen_lake")), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        _, tokenizer = tiny_policy
        formatter, backend = ChatFormatter(tokenizer), ScriptedBackend("teacher_mix", tokenizer)
        spec = RolloutSpec("frozen_lake", [3, 11], 2, 3, 1, 3, split="train")
        held_out._SPLITS.clear()
        here = run_rollouts(spec, backend, formatter, seed=5)
        held_out._SPLITS.clear()
        there = run_rollouts(replace(spec, env_remote=url, user_code_timeout_s=60.0), backend, formatter, seed=5)
        assert [asdict(record) for record in there] == [asdict(record) for record in here]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listener.close()
