"""Rollout backend on vLLM (``rollout.backend: vllm``; the ``gpu`` extra, written against vLLM 0.33.0).

vLLM is CUDA-only and large, so it is imported lazily: nothing here touches it until an engine is built, and a
missing install raises :class:`BackendUnavailable` saying how to get it. Written against vLLM 0.33.0's documented
API and read from its source, but **not run here** (no GPU on the machines this project is tested on): what is
tested on CPU is the conversion of vLLM's outputs into our records (:func:`generations_from_vllm`) and the error.

- Sampling: ``SamplingParams(temperature, top_p, top_k, max_tokens, seed, logprobs=0, stop_token_ids)`` per
  request, with the engine built with ``logprobs_mode="processed_logprobs"``, so the returned log-prob of each
  sampled token is the sampler's own (after temperature and top-k/top-p), as the Hugging Face backend records it,
  and ``generation_config="vllm"``, so the model folder's generation defaults change nothing. Prompts go in as token
  ids (``{"prompt_token_ids": ...}``): nothing is re-tokenised.
- Records: the same :class:`~ragen_core.rollout.types.Generation` as the Hugging Face backend: the reply's ids up to
  and including the first stop token (``truncated`` when there is none), the sampler's log-prob of each, and the text
  decoded with our tokenizer.
- New weights: after each update the engine reloads the policy in place from a Hugging Face export
  (``LLM.collective_rpc("reload_weights", kwargs={"weights_path": ...})`` on every tensor-parallel worker) and drops
  its prefix cache; no restart.
- Reproducibility: each request is seeded from (call seed, index), but vLLM's kernels depend on batch composition, so
  vLLM rollouts are reproducible only up to that; the bitwise resume guarantee holds for the Hugging Face backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragen_core.rollout.hf_backend import stop_token_ids
from ragen_core.rollout.types import Generation, TurnContext
from ragen_core.seeding import derive_seed

VLLM_VERSION = "0.33.0"  # the version this backend was written against (pinned in the gpu extra)


class BackendUnavailable(RuntimeError):
    """The rollout backend's package is not installed (or cannot run here); the message says what to do."""


def import_vllm() -> Any:
    """The ``vllm`` module, or :class:`BackendUnavailable` explaining how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise BackendUnavailable(
            f"rollout.backend=vllm needs vLLM, which is not installed ({exc}). vLLM is CUDA-only: on a GPU machine "
            f"install the gpu extra (pip install 'ragen-flows[gpu]', vLLM {VLLM_VERSION}), or use rollout.backend=hf"
        ) from exc
    return vllm


class VLLMEngine:
    """One vLLM engine per run session; loads each new policy in place after an update."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    @classmethod
    def from_config(cls, config: Any, model_dir: Path, precision: str) -> VLLMEngine:
        """Build the engine for ``model_dir`` (a Hugging Face folder with its tokenizer) from ``rollout.vllm``."""
        vllm = import_vllm()
        settings = config.rollout.vllm
        dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision]
        llm = vllm.LLM(
            model=str(model_dir),
            tokenizer=str(model_dir),
            tensor_parallel_size=settings.tensor_parallel_size,
            dtype=dtype,
            seed=config.seed,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enforce_eager=settings.enforce_eager,
            max_model_len=settings.max_model_len,
            logprobs_mode="processed_logprobs",  # log-probs after temperature / top-k / top-p: the sampler's own
            generation_config="vllm",  # ignore the model folder's sampling defaults
        )
        return cls(llm)

    def load_weights(self, folder: Path) -> None:
        """Reload the policy's weights in place from the Hugging Face export in ``folder`` (every worker)."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def close(self) -> None:
        """Release the engine (vLLM frees its GPU memory when the object goes)."""
        self.llm = None


class VLLMBackend:
    """Samples replies with a :class:`VLLMEngine`; same interface and records as the Hugging Face backend."""

    behavior_source = "policy"

    def __init__(
        self,
        engine: VLLMEngine,
        tokenizer: Any,
        temperature: float,
        max_new_tokens: int,
        top_p: float = 1.0,
        top_k: int = 0,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.max_new_tokens = max_new_tokens
        self.stop_ids = stop_token_ids(tokenizer)

    def sampling_params(self, count: int, seed: int) -> list[Any]:
        """One ``SamplingParams`` per request, each seeded from (``seed``, its index)."""
        vllm = import_vllm()
        return [
            vllm.SamplingParams(
                n=1,
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,  # 0 = off
                max_tokens=self.max_new_tokens,
                seed=derive_seed(seed, index),
                logprobs=0,  # the sampled token's own log-prob only
                stop_token_ids=self.stop_ids,
                detokenize=False,  # the text is decoded with our tokenizer, as the Hugging Face backend does
            )
            for index in range(count)
        ]

    def generate(self, contexts: list[TurnContext], seed: int) -> list[Generation]:
        """Sample one reply per context; every request is seeded from ``seed`` and its index."""
        params = self.sampling_params(len(contexts), seed)
        prompts = [{"prompt_token_ids": list(context.prompt_ids)} for context in contexts]
        outputs = self.engine.llm.generate(prompts, params, use_tqdm=False)
        return generations_from_vllm(outputs, self.tokenizer, self.stop_ids)


def generations_from_vllm(outputs: Sequence[Any], tokenizer: Any, stop_ids: Sequence[int]) -> list[Generation]:
    """Our records from vLLM's ``RequestOutput`` list (one completion each, in prompt order).

    Each completion's ``token_ids`` are cut after the first stop token (``truncated`` when there is none) and each
    kept token's log-prob is read from ``logprobs[i][token_id].logprob``. Raises ``ValueError`` when a completion
    has no log-probs for its tokens (the sampling params did not ask for them).
    """
    stop = set(stop_ids)
    generations = []
    for number, output in enumerate(outputs):
        completion = output.outputs[0]
        tokens = [int(token) for token in completion.token_ids]
        positions = completion.logprobs
        if positions is None or len(positions) < len(tokens):
            raise ValueError(f"vLLM output {number} has no log-prob for every token; sample with logprobs=0")
        end = next((i + 1 for i, token in enumerate(tokens) if token in stop), None)
        truncated = end is None
        tokens = tokens[: len(tokens) if end is None else end]
        logprobs = []
        for index, token in enumerate(tokens):
            entry = positions[index].get(token)
            if entry is None:
                raise ValueError(f"vLLM output {number}: no log-prob for sampled token {token} at position {index}")
            logprobs.append(float(entry.logprob))
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        generations.append(Generation(tokens, logprobs, text, truncated))
    return generations
