"""The sections of what a run plays and samples: the start model, the environment, the rollouts."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ragen_core.config.base import MAX_COUNT, MAX_NEW_TOKENS, MAX_SCALE, PositiveInt, Section, Seed
from ragen_core.config.trust import trusted_entries, trusted_only


class TinyModelConfig(Section):
    """Shape of the tiny randomly initialised Qwen2-architecture default model (built locally, no download)."""

    hidden_size: PositiveInt = Field(64, description="Model width.")
    num_layers: PositiveInt = Field(2, description="Number of transformer blocks.")
    num_heads: PositiveInt = Field(
        2,
        description="Attention heads; must divide hidden_size. Heads of 32 (64 / 2): vLLM's CPU attention takes "
        "head sizes of 32 and more.",
    )
    num_kv_heads: PositiveInt = Field(
        1, description="Key/value heads (grouped-query attention); must divide num_heads."
    )
    intermediate_size: PositiveInt = Field(256, description="MLP width.")
    vocab_size: PositiveInt = Field(1024, description="Target BPE vocabulary size of the locally trained tokenizer.")
    seed: Seed = Field(0, description="Seed of the weight initialisation (0 to 2**32 - 1).")

    @model_validator(mode="after")
    def _check_heads(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"model.tiny.num_heads={self.num_heads} must divide hidden_size={self.hidden_size}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model.tiny.num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        return self


class ModelConfig(Section):
    """Which policy model to start from."""

    path: str | None = Field(
        None,
        description="Local Hugging Face causal-LM directory. None: the tiny default, built under the data root.",
        json_schema_extra=trusted_only("path"),
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig, description="Shape of the tiny default model.")


class EnvConfig(Section):
    """The training environment and the per-trajectory interaction limits (enforced by the rollout layer)."""

    name: str = Field(
        "bandit",
        description="Environment of the training rollouts: a registered name, a name an installed distribution "
        "registers (entry points of ragen.envs), or package.module:Class of your own (docs/usage.md).",
        json_schema_extra=trusted_only("module"),
    )
    val_envs: list[str] | None = Field(
        None,
        description="Environments evaluated during validation (names as env.name); None: [name].",
        json_schema_extra=trusted_only("module"),
    )
    max_turns: PositiveInt = Field(1, description="Maximum turns (model replies) per trajectory.")
    max_actions_per_turn: PositiveInt = Field(1, description="Actions parsed from one reply (split on '||').")
    max_actions_per_traj: PositiveInt = Field(1, description="Action budget of a whole trajectory.")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword settings of the environment (passed to it when it is built). Of any env, data_file (a "
        "file it reads), reward_fn and wrong_answer_fn (package.module:function it imports) are held to the "
        "stored-config trust rules (docs/security.md).",
        json_schema_extra=trusted_entries(data_file="path", reward_fn="module", wrong_answer_fn="module"),
    )
    user_code_timeout_s: Annotated[float, Field(gt=0, le=86400)] | None = Field(
        300.0,
        description="Seconds one call of your own code may take (an env class's reset or step, the dataset env's "
        "reward function; its first rows' check too): a call still running then fails the run in one line naming "
        "it and its rollout row, instead of a silent hang. Your code runs in a thread of its own for this; null "
        "calls it in the rollout's thread with no limit (for code that needs the main thread, e.g. signal.alarm). "
        "Built-in envs never use it.",
    )

    @property
    def validation_envs(self) -> list[str]:
        return list(self.val_envs) if self.val_envs else [self.name]


class VLLMConfig(Section):
    """The vLLM rollout server (``rollout.backend: vllm``): started with the run from the vLLM environment
    (``make install-vllm``), weights pushed after every update and checked."""

    python: str | None = Field(
        None,
        description="Python of the vLLM environment; None: $RAGEN_VLLM_PYTHON, else .venv-vllm beside this "
        "project's environment (where `make install-vllm` builds it).",
        json_schema_extra=trusted_only("program", env="RAGEN_VLLM_PYTHON"),
    )
    tensor_parallel_size: PositiveInt = Field(1, description="GPUs the server shards the policy over.")
    gpu_memory_utilization: float = Field(
        0.4,
        gt=0,
        le=1,
        description="GPU machines: share of each GPU's memory vLLM may take (weights + KV cache); the rest is left to "
        "the DeepSpeed engines that share the GPU.",
    )
    kv_cache_gib: float | None = Field(
        None,
        gt=0,
        le=1024,
        description="KV cache size in GiB; None: 1 GiB on the CPU (over 2 million tokens of the tiny model), "
        "gpu_memory_utilization on a GPU.",
    )
    enforce_eager: bool = Field(
        False, description="Skip vLLM's compilation (CUDA graphs, torch.compile): faster start, slower decoding."
    )
    prefix_caching: bool = Field(
        True,
        description="Later turns of a multi-turn rollout reuse the keys and values of its earlier turns (emptied "
        "before every rollout, so resumes stay exact); false recomputes every prompt (measured on multi-turn Sokoban "
        "at the 20M model: 0.5x the Hugging Face backend's tokens per second instead of 2x).",
    )
    max_model_len: Annotated[int, Field(gt=0, le=MAX_NEW_TOKENS)] | None = Field(
        None, description="Longest sequence (prompt + reply) the server serves; None: the model's own limit."
    )
    startup_timeout: float = Field(
        900.0, gt=0, le=86400, description="Seconds to wait for the server's engine to be ready."
    )
    check_tolerance: float | None = Field(
        None,
        gt=0,
        le=100,
        description="After every weight push the server scores a probe sequence; the largest log-prob difference "
        "from the trainer's model must stay within this. None: 1e-4 in float32, 0.1 in bf16/fp16.",
    )


class RolloutConfig(Section):
    """How training rollouts are generated."""

    env_groups: PositiveInt = Field(8, description="Initial states (groups) per iteration (paper: P=8).")
    group_size: PositiveInt = Field(16, description="Rollouts per initial state; members share the env seed (N=16).")
    backend: str = Field(
        "hf",
        description="A registered rollout backend (ragen_core.rollout.samplers): 'hf', the policy samples through "
        "Hugging Face generate; 'vllm', through a vLLM rollout server (`make install-vllm`; see rollout.vllm); "
        "'scripted', a Python policy.",
    )
    vllm: VLLMConfig = Field(default_factory=lambda: VLLMConfig(), description="The vLLM server (backend='vllm').")
    scripted_policy: str = Field("random", description="Scripted policy name when backend='scripted'.")
    temperature: float = Field(1.0, gt=0, le=100, description="Sampling temperature of training rollouts.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling; 1.0 keeps the sampler's log-probs exact.")
    top_k: int = Field(0, ge=0, le=MAX_COUNT, description="Top-k sampling; 0 disables it.")
    max_new_tokens: Annotated[int, Field(gt=0, le=MAX_NEW_TOKENS)] = Field(
        48, description="Maximum tokens of one reply (paper scale: 400)."
    )
    enable_think: bool = Field(True, description="Ask for and parse <think>...</think> before <answer>.")
    think_prefix: bool = Field(
        True,
        description="With enable_think: end every prompt with <think> after the assistant header, so the model "
        "continues from inside the thinking block (RAGEN's prompts); the prefix is not trained.",
    )
    prompt_style: Literal["full", "compact"] = Field(
        "full",
        description="'full': RAGEN's prompts (system message, rules and symbol legend, a format reminder every turn). "
        "'compact': no system message, the env's one-line rule, the actions, the state and the budget (about a "
        "quarter of the text; what a small randomly initialised model can learn to read, docs/findings.md).",
    )
    format_penalty: float = Field(
        -0.1, ge=-MAX_SCALE, le=0, description="Added once per turn whose reply breaks the format."
    )
    reply_format: Literal["strict", "lenient"] = Field(
        "strict",
        description="How a reply is read. 'strict': the <think>/<answer> tags must span the whole reply (whitespace "
        "aside) and the reply must end (a stop token before max_new_tokens); anything else is a format error, no "
        "action. 'lenient': RAGEN's search, text around the tags and truncation tolerated. RAGEN rewrites each reply "
        "to its tags before training; this project trains on the sampled tokens, so a tolerated tail is learned "
        "(docs/algorithms.md, 'Replies that do not end').",
    )
    context_window_mode: Literal["full", "limited_multi_turn", "single_turn"] = Field(
        "full",
        description="What the model sees at each turn (RAGEN-2's context_window_mode). 'full': the whole chat so far "
        "(one training sequence per trajectory). 'limited_multi_turn': the system and first message, then the last "
        "max_context_window turns as chat turns. 'single_turn': one user message holding the last "
        "max_context_window - 1 turns as text, then the current turn. The windowed modes train each turn's reply "
        "in the exact window it was sampled in (the turn sequences are packed into the trajectory's row).",
    )
    max_context_window: PositiveInt | None = Field(
        None,
        description="Turns in the window, the current one included (1: only the current turn); required by "
        "limited_multi_turn and single_turn, unused by full.",
    )
    training_rows: Literal["trajectory", "turn"] = Field(
        "trajectory",
        description="Windowed modes: the update's rows. 'trajectory': one row per trajectory packing its turns' "
        "sequences; 'turn': every turn is its own row carrying the trajectory's score (RAGEN-2's samples in its "
        "context-window modes), so the loss aggregation and mini-batches count turns; GRPO and the filter still "
        "count each trajectory once. 'full' mode: trajectory only.",
    )

    sampler_threads: PositiveInt = Field(
        1,
        le=MAX_COUNT,
        description="trainer.max_staleness >= 1 with backend=hf: torch threads of the sampler process that generates "
        "while the learner updates (the learner keeps trainer.num_threads). Part of what makes its numbers: keep it "
        "when resuming.",
    )

    @model_validator(mode="after")
    def _check_window(self) -> RolloutConfig:
        if self.context_window_mode == "full" and self.max_context_window is not None:
            raise ValueError(
                "rollout.max_context_window only applies to windowed modes: set rollout.context_window_mode to "
                "limited_multi_turn or single_turn, or drop rollout.max_context_window"
            )
        if self.context_window_mode != "full" and self.max_context_window is None:
            raise ValueError(
                f"rollout.context_window_mode={self.context_window_mode} needs rollout.max_context_window (the "
                "number of turns the model sees, the current one included, >= 1)"
            )
        if self.context_window_mode == "full" and self.training_rows == "turn":
            raise ValueError(
                "rollout.training_rows=turn cuts the windowed rows into their turns' sequences; in full mode a "
                "trajectory is one sequence: set rollout.context_window_mode to limited_multi_turn or single_turn "
                "(RAGEN-2 trains turn rows only there), or rollout.training_rows=trajectory"
            )
        return self
