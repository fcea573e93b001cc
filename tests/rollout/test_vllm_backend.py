"""The vLLM rollout backend. vLLM is CUDA-only and not installable on the CPU machines this suite runs on, so here
only what does not need it is tested: the conversion of vLLM's outputs (objects of the shape vLLM 0.33's
``RequestOutput`` has) into our records, the records' equality with the Hugging Face backend's for the same sampled
tokens, and the error when vLLM is missing. The comparison against real vLLM runs only where vLLM and a GPU are
present (marker ``gpu``); it has not been run for this project yet."""

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from ragen_core.agent import ChatFormatter
from ragen_core.config import TinyModelConfig, build_config
from ragen_core.rollout import RolloutSpec, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend, stop_token_ids
from ragen_core.rollout.types import TurnContext
from ragen_core.rollout.vllm_backend import (
    VLLM_VERSION,
    BackendUnavailable,
    VLLMBackend,
    VLLMEngine,
    generations_from_vllm,
)

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _output(tokens, logprobs):
    """A stand-in for vLLM's RequestOutput: ``outputs[0]`` with ``token_ids`` and per-position ``{id: Logprob}``."""
    pairs = zip(tokens, logprobs, strict=True)
    positions = [{t: SimpleNamespace(logprob=lp, rank=1, decoded_token=None)} for t, lp in pairs]
    completion = SimpleNamespace(token_ids=list(tokens), logprobs=positions, text="", finish_reason="stop")
    return SimpleNamespace(prompt_token_ids=[1, 2], outputs=[completion])


def test_outputs_become_records_cut_after_the_first_stop_token(tiny_policy):
    _, tokenizer = tiny_policy
    stop = stop_token_ids(tokenizer)
    word = tokenizer.encode("<answer>Gold</answer>", add_special_tokens=False)
    finished = _output([*word, stop[0]], [-0.5] * len(word) + [-0.25])
    capped = _output(word, [-1.0] * len(word))
    generations = generations_from_vllm([finished, capped], tokenizer, stop)
    assert generations[0].token_ids == [*word, stop[0]] and not generations[0].truncated
    assert generations[0].logprobs == [-0.5] * len(word) + [-0.25]
    assert generations[0].text == "<answer>Gold</answer>"  # decoded by our tokenizer, special tokens skipped
    assert generations[1].token_ids == word and generations[1].truncated
    after_stop = generations_from_vllm([_output([word[0], stop[0], word[1]], [-1.0, -2.0, -3.0])], tokenizer, stop)
    assert after_stop[0].token_ids == [word[0], stop[0]] and after_stop[0].logprobs == [-1.0, -2.0]


def test_outputs_without_logprobs_are_refused(tiny_policy):
    _, tokenizer = tiny_policy
    bare = SimpleNamespace(outputs=[SimpleNamespace(token_ids=[5, 6], logprobs=None)])
    with pytest.raises(ValueError, match="logprobs=0"):
        generations_from_vllm([bare], tokenizer, stop_token_ids(tokenizer))
    wrong = _output([5, 6], [-1.0, -1.0])
    wrong.outputs[0].logprobs[1] = {7: SimpleNamespace(logprob=-1.0)}
    with pytest.raises(ValueError, match="sampled token 6"):
        generations_from_vllm([wrong], tokenizer, stop_token_ids(tokenizer))


def test_records_equal_the_hugging_face_backends_for_the_same_tokens(tiny_policy):
    """What HF sampled, returned the way vLLM returns it (its token ids with the stop token, the sampler's log-prob
    per position), converts into exactly the HF backend's records."""
    model, tokenizer = tiny_policy
    formatter = ChatFormatter(tokenizer)
    prompts = [formatter.start(f"Pick an arm, round {i}.") for i in range(6)]
    contexts = [TurnContext(p, None, 1, 1, True) for p in prompts]
    hf = HFBackend(model, tokenizer, temperature=1.0, max_new_tokens=12).generate(contexts, seed=4)
    as_vllm = [_output(g.token_ids, g.logprobs) for g in hf]
    assert generations_from_vllm(as_vllm, tokenizer, stop_token_ids(tokenizer)) == hf


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_a_missing_vllm_says_how_to_get_it(tiny_policy, tiny_model_dir):
    _, tokenizer = tiny_policy
    config = build_config({"model": {"path": str(tiny_model_dir)}, "rollout": {"backend": "vllm"}})
    with pytest.raises(BackendUnavailable, match=rf"ragen-flows\[gpu\].*{VLLM_VERSION}.*rollout.backend=hf"):
        VLLMEngine.from_config(config, tiny_model_dir, "fp32")
    backend = VLLMBackend(VLLMEngine(llm=None), tokenizer, temperature=1.0, max_new_tokens=8)
    with pytest.raises(BackendUnavailable, match="CUDA-only"):
        backend.generate([TurnContext([1, 2, 3], None, 1, 1, True)], seed=0)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_a_session_asking_for_vllm_fails_before_loading_anything(tmp_path, tiny_model_dir):
    from ragen_core.run.session import open_session
    from ragen_core.storage import DataLake

    config = build_config({"model": {"path": str(tiny_model_dir)}, "rollout": {"backend": "vllm"}})
    with pytest.raises(BackendUnavailable, match="not installed"):
        open_session(config, DataLake(tmp_path), "v", tiny_model_dir)
    assert DataLake(tmp_path).read_manifest("v") is None  # nothing was written


# -- on a GPU with vLLM installed (not run for this project yet) -------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_VLLM or not torch.cuda.is_available(), reason="needs vLLM (gpu extra) and a CUDA GPU")
def test_vllm_records_match_the_hugging_face_backend(tmp_path):
    """Same prompts through both backends: vLLM's records are token-exact (valid ids, one log-prob per token, the
    same prompts), re-scoring vLLM's sampled ids with the Hugging Face model at temperature 1 gives vLLM's log-probs,
    and after the policy changes, reloading it into the live engine makes vLLM sample from the new weights."""
    from ragen_core.policy import ensure_tiny_model, load_policy
    from ragen_core.training import collate, token_logprobs

    model_dir = ensure_tiny_model(TinyModelConfig(hidden_size=256, num_heads=4, num_kv_heads=2), tmp_path / "models")
    config = build_config({"model": {"path": str(model_dir)},
                           "rollout": {"backend": "vllm", "vllm": {"enforce_eager": True}}})  # fmt: skip
    model, tokenizer = load_policy(model_dir)
    model = model.cuda().eval()
    engine = VLLMEngine.from_config(config, model_dir, "fp32")
    spec = RolloutSpec("bandit", [1, 2, 3], 4, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    formatter = ChatFormatter(tokenizer)

    def check(records):
        batch = collate([r.input_ids for r in records], [r.loss_mask for r in records], tokenizer.pad_token_id)
        with torch.no_grad():
            scored, _ = token_logprobs(model, batch.to("cuda"))
        for row, record in enumerate(records):
            assert len(record.input_ids) == len(record.loss_mask) == len(record.behavior_logprobs)
            assert all(0 <= token < model.config.vocab_size for token in record.input_ids)
            mask = torch.tensor(record.loss_mask, dtype=torch.bool)
            stored = torch.tensor(record.behavior_logprobs)[mask]
            torch.testing.assert_close(scored[row, : len(record.input_ids)].cpu()[mask], stored, atol=2e-3, rtol=0)

    vllm_records = run_rollouts(spec, VLLMBackend(engine, tokenizer, 1.0, 16), formatter, seed=0)
    hf_records = run_rollouts(spec, HFBackend(model, tokenizer, 1.0, 16), formatter, seed=0)
    for ours, theirs in zip(vllm_records, hf_records, strict=True):
        first = ours.loss_mask.index(1)
        assert ours.input_ids[:first] == theirs.input_ids[: theirs.loss_mask.index(1)]  # the same prompts
    check(vllm_records)

    with torch.no_grad():  # a "policy update": new weights, exported and reloaded into the running engine
        model.lm_head.weight.mul_(3.0)
    model.save_pretrained(tmp_path / "updated")
    tokenizer.save_pretrained(tmp_path / "updated")
    engine.load_weights(tmp_path / "updated")
    check(run_rollouts(spec, VLLMBackend(engine, tokenizer, 1.0, 16), formatter, seed=1))
    engine.close()
