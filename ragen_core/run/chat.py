"""The chat a client sends a run's policy, written out for people (``ragen export``'s README): the system prompt, the
first user message of an env instance and how the chat template is used, built by the functions the rollouts use
(:data:`~ragen_core.agent.prompts.SYSTEM_PROMPT`, :func:`~ragen_core.rollout.engine.opening_message`), so the text
cannot drift from what the policy was trained on."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen_core.agent.prompts import SYSTEM_PROMPT, reply_prefix, rules_text
from ragen_core.agent.tool_chat import first_tool_message
from ragen_core.config import ConfigError, RunConfig
from ragen_core.config.trust import TRUST_MODULE_FLAG, TRUSTED_PATHS_VARIABLE, UntrustedConfigError, trusted_keys
from ragen_core.envs import make_env
from ragen_core.envs.held_out import validation_seeds
from ragen_core.envs.mcp_tools import merged_tools, schema_name
from ragen_core.envs.remote import RemoteEnvError, open_env
from ragen_core.envs.tool_env import is_tool_env
from ragen_core.rollout.engine import opening_message
from ragen_core.run.checks import build_stored_run_config, manifest_config, stored_trust_refusals
from ragen_core.storage import DataLake
from ragen_core.storage.layout import CHECKPOINT_ADAPTER, CHECKPOINT_HF, checkpoint_file


def first_chat(config: RunConfig, env_name: str, env_seed: int) -> list[dict[str, str]]:
    """The messages of the first turn of ``env_name``'s instance ``env_seed`` as the run's rollouts build them: the
    system prompt (none with ``rollout.prompt_style=compact``) and the first user message."""
    remote = (config.env.remote_for(env_name), config.env.user_code_timeout_s)
    env = open_env(env_name, dict(config.env.options), *remote)
    state, _ = env.reset(env_seed)
    style = config.rollout.prompt_style
    user = opening_message(
        env,
        state,
        config.env.max_actions_per_traj,
        config.env.max_actions_per_turn,
        config.rollout.enable_think,
        style,
    )
    if is_tool_env(env):  # a tool env's first message, as its rollouts write it (the tools go in tools=)
        user = first_tool_message(rules_text(env, style), state, config.env.max_actions_per_turn)
    system = [] if style == "compact" else [{"role": "system", "content": SYSTEM_PROMPT}]
    return [*system, {"role": "user", "content": user}]


def validation_instance(config: RunConfig, env_name: str) -> int:
    """The env seed of the run's first validation instance of ``env_name`` (``group_id`` 0 of its validations)."""
    return validation_seeds(config, env_name)[0]


def chat_markdown(
    config: RunConfig,
    run_id: str,
    model_dir: Path | None,
    export_dir: Path | None = None,
    mcp_tools: list[dict[str, Any]] | None = None,
    base_dir: str | None = None,
) -> str:
    """A README section: how to prompt the policy of ``run_id`` (its checkpoint's Hugging Face export at
    ``model_dir``, when it has one; a path relative to ``export_dir`` for its copy in the export), with the first
    turn of its first validation instance as the example and a ``transformers`` snippet that runs from any folder.
    ``mcp_tools``: the schemas of the tools of the run's MCP server (``env.mcp``), as its manifest recorded them,
    joined to a tool env's own as its rollouts joined them; the server itself is never started here. ``base_dir``:
    the policy is LoRA adapters (``model_dir`` their folder) on that model, which the snippet loads with PEFT."""
    env_name = config.env.name
    seed = validation_instance(config, env_name)
    messages = first_chat(config, env_name, seed)
    tools = _tools_lines(config, env_name, mcp_tools)
    prefix = reply_prefix(config.rollout.enable_think, config.rollout.think_prefix)
    system = "none (`rollout.prompt_style=compact`)" if len(messages) == 1 else f"`{messages[0]['content']}`"
    if model_dir is None:
        where, export_dir = "<the run's checkpoint>/hf", None
    else:  # a copy in the export: relative to its folder; else the checkpoint's folder, from anywhere
        where = str(model_dir) if export_dir is not None else os.path.abspath(model_dir)
    lines = [
        f"## Prompting the policy of `{run_id}`",
        "",
        f"The chat its rollouts were: system prompt {system}; then one user message per turn (the first holds the "
        f"env's rules and actions). Below, the first turn of `{env_name}` instance {seed} (the run's first validation "
        "instance: `group_id` 0 of its `split = 'val'` rows). Render it with the checkpoint's own chat template, "
        "`apply_chat_template(messages, add_generation_prompt=True)`: that export's template ends the prompt with "
        f"the reply prefix training used ({json.dumps(prefix) if prefix else 'none'}), so a client adds nothing. "
        "The policy's reply is the text it generates; later turns append it as an assistant message and the env's "
        "next user message.",
        "",
        "```python",
        *_model_dir_lines(where, export_dir),
        "tokenizer = AutoTokenizer.from_pretrained(model_dir)",
        *_model_lines(base_dir),
        f"messages = {json.dumps(messages, indent=4)}",
        *tools,
        "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, "
        f'return_tensors="pt"{", tools=tools" if tools else ""})',
        f"output = model.generate(**inputs, max_new_tokens={config.rollout.max_new_tokens}, do_sample=False)",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "```",
        "",
    ]
    return "\n".join(lines)


# The stored keys the chat never uses: it is built from the env section alone (the env, its options, the prompts),
# never loads the model, starts a program, a launcher or a host, nor logs to a tracker, so the export needs no
# permission for the keys of the other sections.
# The MCP server of env.mcp is never started either: its tools are those the run's manifest recorded (mcp_tools).
CHAT_UNUSED_KEYS = frozenset(
    key.key for key in trusted_keys(RunConfig) if not key.key.startswith("env.") or key.key == "env.mcp"
)


def _tools_lines(config: RunConfig, env_name: str, mcp_tools: list[dict[str, Any]] | None = None) -> list[str]:
    """The snippet's ``tools`` (the function schemas a tool env's rollouts render with the chat template, its calls
    then read in ``rollout.tool_parser``'s format), with the MCP server's (``mcp_tools``) joined as the rollouts
    joined them; none for other envs."""
    env = make_env(env_name, **config.env.options) if config.env.remote_for(env_name) is None else None
    if not is_tool_env(env):
        return []
    schemas = merged_tools(env.tool_schemas(), list(mcp_tools or []), schema_name)
    note = f"# its calls come back in the {config.rollout.tool_parser} format; each result as a tool message"
    return [f"tools = {json.dumps(schemas, indent=4)}  {note}"]


def _model_lines(base_dir: str | None) -> list[str]:
    """The snippet's model: the folder's own, or (LoRA) the run's start model with the folder's adapters on it."""
    if base_dir is None:
        return ["model = AutoModelForCausalLM.from_pretrained(model_dir)"]
    return [
        "from peft import PeftModel  # the policy is LoRA adapters on the run's start model",
        "",
        f"base_dir = {json.dumps(base_dir)}  # the run's start model (its manifest's model_dir)",
        "model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), model_dir)",
    ]


def _model_dir_lines(where: str, export_dir: Path | None) -> list[str]:
    """The snippet's first lines: its imports and ``model_dir``, the policy's folder. A copy in the export is named
    from the export's folder, written out absolute (a relative path would be looked up from wherever the snippet
    runs, and transformers takes a missing folder for a hub id); a moved export changes one line."""
    imports = ["from transformers import AutoModelForCausalLM, AutoTokenizer", ""]
    if export_dir is None:
        return [*imports, f"model_dir = {json.dumps(where)}"]
    return [
        "import os",
        "",
        *imports,
        f"export_dir = {json.dumps(str(export_dir))}  # this export's folder (moved: its new place)",
        f"model_dir = os.path.join(export_dir, {json.dumps(Path(where).as_posix())})",
        "if not os.path.isdir(model_dir):",
        '    raise SystemExit(f"no policy at {model_dir}: set export_dir to the folder of this README")',
    ]


def untrusted_advice(refused: list[UntrustedConfigError]) -> str:
    """Why a run's chat is left out of an export (every refused key) and the one command that writes it: a folder
    listed in :data:`~ragen_core.config.trust.TRUSTED_PATHS_VARIABLE` for a file outside the data root,
    ``--trust-env-module`` for a module of the user's own."""
    reasons, fixes = [], []
    for exc in refused:
        shown = json.dumps(exc.value)
        if exc.kind == "path":
            reasons.append(f"reads a file outside the data root ({exc.key}={shown})")
            folder = shlex.quote(os.path.dirname(os.path.abspath(os.path.expanduser(str(exc.value)))))
            fixes.append(f"{TRUSTED_PATHS_VARIABLE}={folder} in the environment")
        else:
            reasons.append(f"names code of its own ({exc.key}={shown})")
            fixes.append(f"`{TRUST_MODULE_FLAG}`")
    return (
        f"its stored config {' and '.join(dict.fromkeys(reasons))}, which `ragen export` does not use unless "
        f"allowed: export again with {' and '.join(dict.fromkeys(fixes))} (docs/security.md)"
    )


@dataclass
class ExportNotes:
    """The README sections of ``ragen export`` (:func:`export_notes`) and the runs whose chat they leave out, each
    with the reason and what makes the export write it."""

    markdown: str
    left_out: dict[str, str] = field(default_factory=dict)


def export_notes(
    lake: DataLake,
    run_ids: list[str],
    trusted_kinds: frozenset[str] = frozenset(),
    copies: dict[str, Path] | None = None,
    export_dir: Path | None = None,
    merged: set[str] | frozenset[str] = frozenset(),
) -> ExportNotes:
    """The README sections of ``ragen export`` on prompting each run's policy (:func:`chat_markdown`), its newest
    checkpoint's export as the model (or, for a run in ``copies``, its copy in the export: a path relative to
    ``export_dir``, the export's folder); a run whose manifest holds no config (a bootstrap's) is said to have none,
    and one whose stored config names code or files from outside (an env ``package.module:Class``, a reward
    function, a data file) is left out, with the reason (:func:`untrusted_advice`), unless the user allowed that kind
    (``trusted_kinds``: ``{"module"}`` for ``ragen export --trust-env-module``): building its env would import or
    read what a file of the data root names. The keys the chat never uses (:data:`CHAT_UNUSED_KEYS`) need no
    permission. A LoRA run's policy is its adapters on its start model (the manifest's ``model_dir``), loaded with
    PEFT, unless it is in ``merged`` (its copy is the merged model)."""
    notes = ExportNotes("")
    sections = []
    for run_id in dict.fromkeys(run_ids):
        manifest = lake.read_manifest(run_id)
        tree = manifest.config if manifest is not None else None
        if tree is None:
            sections.append(f"## Prompting the policy of `{run_id}`\n\nIts manifest holds no config.\n")
            continue
        stored = manifest_config(lake, run_id, tree)
        unserved = ["env.mcp=null"] if (tree.get("env") or {}).get("mcp") is not None else []  # never started here
        try:  # the trust check first: a stored env or reward of the user's own code is never imported here
            config = build_stored_run_config(stored, unserved, trusted_kinds=trusted_kinds, unused=CHAT_UNUSED_KEYS)
        except UntrustedConfigError:
            refused = stored_trust_refusals(stored, trusted_kinds, CHAT_UNUSED_KEYS)
            notes.left_out[run_id] = untrusted_advice(refused)
            sections.append(f"## Prompting the policy of `{run_id}`\n\nNot written out: {notes.left_out[run_id]}.\n")
            continue
        except ConfigError as exc:  # its env server did not answer (the run's check asks it): the rows still export
            notes.left_out[run_id] = _unanswered(tree, exc)
            sections.append(f"## Prompting the policy of `{run_id}`\n\nNot written out: {notes.left_out[run_id]}.\n")
            continue
        newest = lake.latest_checkpoint(run_id)
        adapted = newest is not None and checkpoint_file(newest[1], CHECKPOINT_ADAPTER).is_dir()
        where = checkpoint_file(newest[1], CHECKPOINT_ADAPTER if adapted else CHECKPOINT_HF) if newest else None
        copy = (copies or {}).get(run_id)
        base = manifest.model_dir if adapted and not (copy and run_id in merged) else None
        try:
            section = chat_markdown(
                config, run_id, copy or where, export_dir if copy else None, manifest.mcp_tools, base
            )
            sections.append(section + (_unrecorded_tools(tree) if unserved and manifest.mcp_tools is None else ""))
        except RemoteEnvError as exc:
            notes.left_out[run_id] = _unanswered(tree, exc)
            sections.append(f"## Prompting the policy of `{run_id}`\n\nNot written out: {notes.left_out[run_id]}.\n")
    notes.markdown = "\n".join(sections)
    return notes


def _unrecorded_tools(tree: dict) -> str:
    """The note of a run with an MCP server whose manifest records no tools (it stopped before its session opened):
    the snippet's ``tools`` are the env's own only."""
    command = shlex.join((tree.get("env") or {}).get("mcp", {}).get("command") or [])
    return (
        f"\nIts agent also had the tools of the MCP server `{command}` (env.mcp), which its manifest does not "
        "record: add their schemas to `tools` (the server's `tools/list`; one of an env tool's name in its place).\n"
    )


def _unanswered(tree: dict, exc: Exception) -> str:
    """Why a run's chat is left out when its env is played on a server (``env.remote``) that did not answer; any
    other error of its config is raised again."""
    remote = (tree.get("env") or {}).get("remote")
    if not remote or "env server" not in str(exc):
        raise exc
    return (
        f"its env is played on the env server {remote}, which did not answer (its first turn is the server's to "
        "say): start the server (`ragen env serve ...`), then export again"
    )
