"""The chat a client sends a run's policy, written out for people (``ragen export``'s README): the system prompt, the
first user message of an env instance and how the chat template is used, built by the functions the rollouts use
(:data:`~ragen_core.agent.prompts.SYSTEM_PROMPT`, :func:`~ragen_core.rollout.engine.opening_message`), so the text
cannot drift from what the policy was trained on."""

from __future__ import annotations

import json
from pathlib import Path

from ragen_core.agent.prompts import SYSTEM_PROMPT, reply_prefix
from ragen_core.config import RunConfig
from ragen_core.config.trust import UntrustedConfigError
from ragen_core.envs import make_env
from ragen_core.envs.held_out import validation_seeds
from ragen_core.rollout.engine import opening_message
from ragen_core.run.checks import build_stored_run_config, manifest_config
from ragen_core.storage import DataLake
from ragen_core.storage.layout import CHECKPOINT_HF, checkpoint_file


def first_chat(config: RunConfig, env_name: str, env_seed: int) -> list[dict[str, str]]:
    """The messages of the first turn of ``env_name``'s instance ``env_seed`` as the run's rollouts build them: the
    system prompt (none with ``rollout.prompt_style=compact``) and the first user message."""
    env = make_env(env_name, **dict(config.env.options))
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
    system = [] if style == "compact" else [{"role": "system", "content": SYSTEM_PROMPT}]
    return [*system, {"role": "user", "content": user}]


def validation_instance(config: RunConfig, env_name: str) -> int:
    """The env seed of the run's first validation instance of ``env_name`` (``group_id`` 0 of its validations)."""
    return validation_seeds(config, env_name)[0]


def chat_markdown(config: RunConfig, run_id: str, model_dir: Path | None) -> str:
    """A README section: how to prompt the policy of ``run_id`` (its checkpoint's Hugging Face export at
    ``model_dir``, when it has one), with the first turn of its first validation instance as the example and a
    runnable ``transformers`` snippet."""
    env_name = config.env.name
    seed = validation_instance(config, env_name)
    messages = first_chat(config, env_name, seed)
    prefix = reply_prefix(config.rollout.enable_think, config.rollout.think_prefix)
    system = "none (`rollout.prompt_style=compact`)" if len(messages) == 1 else f"`{messages[0]['content']}`"
    where = str(model_dir) if model_dir is not None else "<the run's checkpoint>/hf"
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
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f"model_dir = {json.dumps(where)}",
        "tokenizer = AutoTokenizer.from_pretrained(model_dir)",
        "model = AutoModelForCausalLM.from_pretrained(model_dir)",
        f"messages = {json.dumps(messages, indent=4)}",
        "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, "
        'return_tensors="pt")',
        f"output = model.generate(**inputs, max_new_tokens={config.rollout.max_new_tokens}, do_sample=False)",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
        "```",
        "",
    ]
    return "\n".join(lines)


def _untrusted(exc: UntrustedConfigError) -> str:
    """Why a run's chat is left out of an export, and the one way the export takes to write it."""
    text = str(exc)
    key = text.split(" sets ", 1)[1].split("=", 1)[0] if " sets " in text else "a key"
    return (
        f"its stored config names code of its own ({key}), which `ragen export` does not import unless asked: run "
        "the export again with `--trust-env-module` to import the modules the stored config names "
        "(docs/security.md)."
    )


def export_notes(
    lake: DataLake,
    run_ids: list[str],
    trusted_kinds: frozenset[str] = frozenset(),
    copies: dict[str, Path] | None = None,
) -> str:
    """The README sections of ``ragen export`` on prompting each run's policy (:func:`chat_markdown`), its newest
    checkpoint's export as the model (or, for a run in ``copies``, its copy in the export: a path relative to the
    export's folder); a run whose manifest holds no config (a bootstrap's) is said to have none, and
    one whose stored config names code or files from outside (an env ``package.module:Class``, a reward function)
    is said to be left out, unless the user allowed that kind (``trusted_kinds``: ``{"module"}`` for ``ragen export
    --trust-env-module``): building its env would import what a file of the data root names."""
    sections = []
    for run_id in dict.fromkeys(run_ids):
        manifest = lake.read_manifest(run_id)
        tree = manifest.config if manifest is not None else None
        if tree is None:
            sections.append(f"## Prompting the policy of `{run_id}`\n\nIts manifest holds no config.\n")
            continue
        try:  # the trust check first: a stored env or reward of the user's own code is never imported here
            config = build_stored_run_config(manifest_config(lake, run_id, tree), trusted_kinds=trusted_kinds)
        except UntrustedConfigError as exc:
            sections.append(f"## Prompting the policy of `{run_id}`\n\nNot written out: {_untrusted(exc)}\n")
            continue
        newest = lake.latest_checkpoint(run_id)
        where = checkpoint_file(newest[1], CHECKPOINT_HF) if newest else None
        sections.append(chat_markdown(config, run_id, (copies or {}).get(run_id, where)))
    return "\n".join(sections)
