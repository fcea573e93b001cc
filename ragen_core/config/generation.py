"""The sections of what a run plays and samples: the start model, the environment, the rollouts."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

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
    adapter: str | None = Field(
        None,
        description="A LoRA adapter folder (PEFT's adapter_config.json and adapter_model.safetensors, e.g. a "
        "checkpoint's adapter/) on the start model: with actor.lora it starts the trained adapters (the same rank, "
        "alpha and layers), without it is merged into the start model's weights (docs/lora.md). None: no adapter.",
        json_schema_extra=trusted_only("path"),
    )


VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # an environment variable's name (env.mcp.pass_env)


class McpServerConfig(Section):
    """An MCP server whose tools a tool env's agent calls (``env.mcp``; docs/environments.md, "Tools from an MCP
    server"): the command that starts it, spoken to over its stdin and stdout (the stdio transport)."""

    command: list[str] = Field(
        ...,
        min_length=1,
        description="The program that starts the server and its arguments, e.g. [python, my_server.py] or [npx, "
        "-y, @modelcontextprotocol/server-everything]; the program is looked up on PATH.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables of the server, by name and value, beside the few it inherits (HOME, "
        "LOGNAME, PATH, SHELL, TERM, USER: the mcp SDK's rule). Their values are stored in the run's config (its "
        "manifest, the runs table, the trackers' params): nothing secret here; a secret goes in pass_env.",
    )
    pass_env: list[str] = Field(
        default_factory=list,
        description="Names of environment variables passed to the server from the run's own environment (e.g. "
        "[API_TOKEN]): their values are read when the server starts and never stored; a name not set then is one "
        "line when the run starts.",
    )
    cwd: str | None = Field(None, description="The folder the server starts in; null: the run's own.")

    @field_validator("command", mode="before")
    @classmethod
    def _command_is_a_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(
                f"is a list of strings, the program and its arguments (e.g. [python, server.py]), not the text "
                f"{value!r}"
            )
        return value

    @field_validator("command")
    @classmethod
    def _command_names_a_program(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise ValueError("starts with the program to run, not an empty text")
        return value

    @field_validator("pass_env")
    @classmethod
    def _pass_env_names_variables(cls, value: list[str]) -> list[str]:
        for name in value:
            if not VARIABLE_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is no environment variable's name (letters, digits, _; not a digit first)")
        return list(dict.fromkeys(value))

    @model_validator(mode="after")
    def _each_variable_once(self) -> McpServerConfig:
        both = [name for name in self.pass_env if name in self.env]
        if both:
            raise ValueError(f"{', '.join(both)} is in both env and pass_env: set one of them")
        return self


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
        "Built-in envs never use it; an env played on a server (env.remote) has each call's answer within it.",
    )
    tool_timeout_s: Annotated[float, Field(gt=0, le=86400)] | None = Field(
        10.0,
        description="A tool env (docs/environments.md, 'Tool environments'): seconds one tool call may run. A call "
        "still running then is abandoned (its thread ends with the process): the agent reads 'error: <tool> did not "
        "return within N s', the turn's tool_calls keep it (error 'timeout') and the run an events row; the run goes "
        "on. null: no limit. Envs without tools never use it.",
    )
    remote: str | None = Field(
        None,
        description="URL of an env server that plays env.name (http://127.0.0.1:PORT, started with `ragen env "
        "serve NAME`): the rollouts reset and step that env over HTTP (OpenEnv's protocol) instead of in this "
        "process, each call within env.user_code_timeout_s; validation envs of another name still run here. "
        "null: in this process. A stored config's host other than this machine's loopback is used only when named "
        "again (docs/security.md).",
        json_schema_extra=trusted_only("host"),
    )
    mcp: McpServerConfig | None = Field(
        None,
        description="An MCP server whose tools join a tool env's (docs/environments.md, 'Tools from an MCP server'): "
        "{command: [program, args...], env: {NAME: value}, pass_env: [NAME, ...], cwd: folder}, started once per "
        "process and spoken to over stdio (pass_env: variables passed from the run's environment by name, their "
        "values never stored; env's values are stored with the config). Its tools' names, descriptions and input "
        "schemas are the agent's tool schemas (a tool of an env tool's name replaces it), each call runs on the "
        "server within env.tool_timeout_s, an error it answers is the agent's to read; a server that cannot start"
        " (within env.user_code_timeout_s) or dies stops the run in one line. null: the env's own tools only, and"
        " out of the config hash. A stored config's server is started only when named again (docs/security.md).",
        json_schema_extra=trusted_only("program"),
    )

    @field_validator("remote")
    @classmethod
    def _remote_is_a_server_url(cls, value: str | None) -> str | None:
        return None if value is None else server_url(value)

    @model_validator(mode="after")
    def _mcp_tools_join_an_env_played_here(self) -> EnvConfig:
        if self.mcp is not None and self.remote is not None:
            raise ValueError(
                "env.mcp gives tools to a tool env played in this process, and env.remote plays env.name on a "
                "server: set one of them"
            )
        return self

    @property
    def validation_envs(self) -> list[str]:
        return list(self.val_envs) if self.val_envs else [self.name]

    def remote_for(self, name: str) -> str | None:
        """The URL of the server that plays env ``name`` (``remote``, for env.name), or None: played here."""
        return self.remote if name == self.name else None


def server_url(text: str) -> str:
    """``text`` as the URL of a server, ``http(s)://host[:port]`` (a trailing ``/`` dropped); a ValueError naming
    what is wrong otherwise (a path, a query, credentials, another scheme)."""
    try:
        parts = urlsplit(text)
        port = parts.port  # a port that is no number, or out of range, raises here
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a URL: {exc}") from None
    wrong = [
        what
        for what, there in (
            ("a scheme other than http or https", parts.scheme not in ("http", "https")),
            ("no host", not parts.hostname),
            ("port 0", port == 0),
            ("credentials", parts.username is not None or parts.password is not None),
            ("a path", parts.path not in ("", "/")),
            ("a query or fragment", bool(parts.query or parts.fragment)),
        )
        if there
    ]
    if wrong:
        raise ValueError(f"{text!r} has {', '.join(wrong)}: write http://HOST:PORT (e.g. http://127.0.0.1:8000)")
    return f"{parts.scheme}://{parts.netloc}"


MAX_SERVERS = 1024  # rollout servers (and shards) of one run


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
    servers: list[str] = Field(
        default_factory=lambda: ["local"],
        min_length=1,
        max_length=MAX_SERVERS,
        description="The rollout servers: 'local', one the run starts (the settings above), and/or the URLs "
        "(http://HOST:PORT) of servers started elsewhere with `ragen rollout serve` (docs/cluster.md; the token in "
        "$RAGEN_ROLLOUT_TOKEN on both sides). Where the rollouts are sampled, never what: free to change on resume. "
        "A stored config's URLs are used only when named again (the run sends them its token).",
        json_schema_extra=trusted_only("servers"),
    )
    shards: PositiveInt = Field(
        1,
        le=MAX_SERVERS,
        description="Parts each turn's requests are split into (group g in part g mod shards), each served as one "
        "request, part k by server k mod (servers): at least the number of servers. A run's rows depend on shards, "
        "never on how many servers serve them (one server with shards=2 stores the rows of two).",
    )
    on_server_loss: Literal["stop", "continue"] = Field(
        "stop",
        description="A server that dies or fails a request: 'stop' the iteration in one line naming it (`ragen "
        "resume` continues bitwise once it is back, or on the other servers); 'continue' on the others, its parts "
        "moved to them (not bitwise: a part moved mid-rollout recomputes the prefixes the lost server cached).",
    )

    @field_validator("servers")
    @classmethod
    def _server_entries(cls, value: list[str]) -> list[str]:
        return [entry if entry == "local" else server_url(entry) for entry in value]

    @model_validator(mode="after")
    def _enough_shards(self) -> VLLMConfig:
        if self.shards < len(self.servers):
            raise ValueError(
                f"rollout.vllm.shards={self.shards} keeps at most {self.shards} of the {len(self.servers)} servers "
                f"busy: set rollout.vllm.shards to at least {len(self.servers)} (a multiple of the servers balances "
                "them)"
            )
        remote = [entry for entry in self.servers if entry != "local"]
        if len(set(remote)) != len(remote):
            raise ValueError("rollout.vllm.servers names a server twice: list each URL once")
        return self


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
    tool_parser: str = Field(
        "hermes",
        description="A tool env: the format the model writes its tool calls in, a registered parser "
        '(ragen_core.tools.parsers): \'hermes\', Hermes / Qwen2.5\'s <tool_call>{"name": ..., "arguments": '
        "{...}}</tool_call> (the tiny default's template); 'llama3_json', Llama 3.1's {\"name\": ..., "
        '"parameters": {...}} per line. Envs without tools never use it.',
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
