"""A rollout backend of this test's own, in this one file, samples a whole run through the rollout room's interface
alone (:class:`ragen_core.rollout.Sampler`: sample a turn's prompts, take new weights, close), registered by name and
chosen by ``rollout.backend``, with nothing of ``ragen_core/run`` changed.

It keeps a copy of the policy of its own, which new weights reach only through ``load``, and samples with Hugging Face
generate: so its run must be the built-in ``hf`` backend's run row for row and weight for weight, which it is only if
it sampled every batch, took each update's weights before the next batch and the final validation, and was closed."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file

import ragen_core
from ragen_core.rollout import Generation, NewWeights, Sampling, TurnContext
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.rollout.samplers import BACKENDS, Backend, RolloutSetup

NAME = "planted_own_copy"
OPENED: list[OwnCopySampler] = []


class OwnCopySampler:
    """Hugging Face generate on a copy of the policy that only :meth:`load` changes (as a remote server's would)."""

    behavior_source = "policy"

    def __init__(self, setup: RolloutSetup) -> None:
        self.model, self.tokenizer = copy.deepcopy(setup.model), setup.tokenizer
        self.turns, self.loads, self.closes = 0, 0, 0

    def generate(self, contexts: list[TurnContext], seed: int, sampling: Sampling) -> list[Generation]:
        self.turns += 1
        backend = HFBackend(
            self.model,
            self.tokenizer,
            sampling.temperature,
            sampling.max_new_tokens,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
        )  # a backend per turn: no reset() is needed, nothing is kept from one turn (or rollout) to the next
        return backend.generate(contexts, seed)

    def load(self, weights: NewWeights) -> None:
        self.model.load_state_dict(weights.module.state_dict())
        self.loads += 1

    def close(self) -> None:
        self.closes += 1


def open_own_copy(setup: RolloutSetup) -> OwnCopySampler:
    OPENED.append(OwnCopySampler(setup))
    return OPENED[-1]


@pytest.fixture
def planted():
    BACKENDS.add(NAME, Backend(open_own_copy))
    try:
        yield NAME
    finally:
        BACKENDS.remove(NAME)
        OPENED.clear()


def _config(model_dir, backend: str) -> dict:
    return {
        "seed": 3,
        "model": {"path": str(model_dir)},
        "env": {"name": "bandit", "val_envs": ["bandit"]},
        "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 8, "backend": backend},
        # re-scored old log-probs on both sides: `auto` reuses the stored ones for the hf backend alone
        "actor": {"mini_batch_size": 8, "micro_batch_size": 4, "reuse_behavior_logprobs": "never"},
        "trainer": {"iterations": 2, "checkpoint_every": 2, "num_threads": 1},
        "eval": {"every": 10, "instances": 2},
        "bootstrap": {"enabled": False},
        "monitor": {"truncated_share": None},
    }


ROWS = "SELECT split, iteration, group_id, traj_index, input_ids, behavior_logprobs FROM trajectories ORDER BY ALL"


def test_a_planted_backend_samples_the_run_the_hf_backend_samples(planted, tiny_model_dir, tmp_path):
    mine, reference = tmp_path / "planted", tmp_path / "hf"
    assert ragen_core.train(_config(tiny_model_dir, planted), mine, "r").status == "completed"
    assert ragen_core.train(_config(tiny_model_dir, "hf"), reference, "r").status == "completed"
    [sampler] = OPENED
    skipped = ragen_core.query("SELECT count(*) AS n FROM metrics WHERE name = 'actor/skipped_update'", mine)
    assert sampler.loads == 2 - skipped.to_pylist()[0]["n"]  # one hand-over per update that trained
    assert sampler.closes == 1  # closed with the session
    assert sampler.turns == 2 + 1 + 1  # a turn per training batch (bandit: one turn) and per validation
    assert ragen_core.query(ROWS, mine).to_pylist() == ragen_core.query(ROWS, reference).to_pylist()
    folder = "runs/r/checkpoints/iteration=2/hf/model.safetensors"
    expected, actual = load_file(reference / folder), load_file(mine / folder)
    assert expected.keys() == actual.keys() and all(torch.equal(expected[k], actual[k]) for k in expected)


def test_an_unknown_backend_is_refused_naming_the_registered_ones(tmp_path):
    from ragen_core.config import ConfigError

    with pytest.raises(ConfigError, match=r"rollout.backend: unknown name 'nope'; registered: hf, scripted, vllm"):
        ragen_core.train({"rollout": {"backend": "nope"}}, tmp_path, "r")
