"""Bootstrap: scripted demonstrations, stored as an ordinary run, then offline SFT on them (the same path as
``ragen retrain --mode sft``: trajectories selected by SQL, trained on exactly as stored).

This teaches a randomly initialised model the reply format before RL. With the ``random`` scripted policy the
demonstrations choose uniformly among valid actions, so any preference the RL run later shows comes from RL.
The bootstrapped model is cached in the lake's ``bootstrap_model_dir(key)`` (``models/bootstrap-<key>``; key = base
model + settings). Runs that need the same bootstrap at once build it once: the builder holds the bootstrap run's
writer lock, the others wait for it and then find the model built. A bootstrap killed half-way is redone from the
start with the same seeds (its files have deterministic names, so the redo replaces them).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ragen_core.config import RunConfig
from ragen_core.envs.external import env_reset
from ragen_core.envs.held_out import holds_out_maps
from ragen_core.envs.watchdog import Watchdog
from ragen_core.faults import maybe_fail
from ragen_core.lineage import lineage_root
from ragen_core.policy import load_policy, save_policy, tokenizer_fingerprint
from ragen_core.rollout import ScriptedBackend, get_scripted_policy, run_rollouts
from ragen_core.rollout.records import BatchMeta
from ragen_core.rollout.scripted import play_scripted, scripted_options
from ragen_core.run.batches import BatchPipeline, BatchRules
from ragen_core.run.entry import open_run
from ragen_core.run.offline import check_tokenizer, select_trajectories
from ragen_core.run.record import library_versions, utc_now
from ragen_core.run.session import chat_formatter, prompt_context
from ragen_core.run.stages import rollout_spec
from ragen_core.seeding import derive_seed, derive_seeds
from ragen_core.storage import DataLake, Stage, query
from ragen_core.storage.layout import bootstrap_name, building
from ragen_core.storage.relocation import stored_path
from ragen_core.training import ActorEngine, OptimConfig
from ragen_core.training.engines import set_determinism
from ragen_core.training.offline import sft_update
from schemas.manifest import RunManifest


def bootstrap_seed(config: RunConfig) -> int:
    """The seed of the demonstrations and their SFT: ``bootstrap.seed``, else the run's."""
    return config.seed if config.bootstrap.seed is None else config.bootstrap.seed


FINGERPRINT_EPISODES = 16  # probe episodes of policy_fingerprint: enough to see any change of choice or thinking


def policy_fingerprint(config: RunConfig) -> str:
    """What the bootstrap's scripted policy does, as a digest: its replies (thinking and actions) over
    ``FINGERPRINT_EPISODES`` fixed episodes of the run's env, played with its options. A policy whose code changed
    writes other replies, so the bootstrap cache never reuses a model built from another policy's demonstrations."""
    from ragen_core.envs.mcp_tools import with_mcp_tools
    from ragen_core.envs.remote import open_env

    policy = get_scripted_policy(config.bootstrap.policy, **scripted_options(config))
    rng = np.random.default_rng(0)
    digest = hashlib.sha256()
    env = open_env(config.env.name, config.env.options, config.env.remote, config.env.user_code_timeout_s)
    env = with_mcp_tools(env, config.env.mcp, config.env.tool_timeout_s, config.env.user_code_timeout_s)
    limits = (config.env.max_turns, config.env.max_actions_per_turn, config.env.max_actions_per_traj)
    with Watchdog(config.env.user_code_timeout_s) as watchdog:  # an env of the user's own: its calls time-limited
        for episode in range(FINGERPRINT_EPISODES):
            env_reset(env, derive_seed(0, "fingerprint", episode), watchdog)
            play_scripted(
                env,
                policy,
                rng,
                limits,
                config.rollout.enable_think,
                lambda reply: digest.update(json.dumps([reply.think, reply.actions]).encode()),
                watchdog,
            )
    return digest.hexdigest()[:16]


def policy_options(config: RunConfig) -> dict[str, Any]:
    """The scripted options the bootstrap's policy takes (none for ``random``: its key ignores ``teacher_prob``)."""
    policy = get_scripted_policy(config.bootstrap.policy, **scripted_options(config))
    return dict(getattr(policy, "keywords", {}))


def bootstrap_key(config: RunConfig, base_dir: Path, root: Path | None = None, code: str | None = None) -> str:
    """Identity of a bootstrap: base model, bootstrap settings, what its policy does, the env and the reply format,
    and the code that trains it. The base model counts by its place relative to the data root ``root`` when it lies
    inside it (the tiny default), so a copied or moved data root finds its bootstraps. The code counts by its
    lineage (``code``; default :func:`ragen_core.lineage.lineage_root` of the code running): a bootstrap that other
    code trained is found again only when re-stamp records vouch that code makes the same rows; otherwise a new one
    is built beside it."""
    payload: dict[str, Any] = {
        "code": code or lineage_root(),
        "base": str(base_dir) if root is None else stored_path(str(base_dir), root),
        # scripted options count only for the policy that takes them (policy_options): random ignores teacher_prob
        "bootstrap": config.bootstrap.model_dump(mode="json", exclude={"seed", *scripted_options(config)}),
        "policy_behaviour": policy_fingerprint(config),
        "policy_options": policy_options(config),
        # the env as the config hash sees it: a key added later counts only once set, and where the env is played
        # (env.remote: a server that serves this env, checked before anything starts) is not what it is
        "env": {k: v for k, v in config.hashed_tree()["env"].items() if k != "remote"},
        "think": config.rollout.enable_think,
        "think_prefix": config.rollout.think_prefix,
        "seed": bootstrap_seed(config),
        "micro_batch_size": config.actor.micro_batch_size,
    }
    # what the demonstrations' prompts look like; left out at the defaults, so those keys stay what they were
    if config.rollout.prompt_style != "full":
        payload["prompt_style"] = config.rollout.prompt_style
    if config.rollout.context_window_mode != "full":
        payload["context_window"] = [config.rollout.context_window_mode, config.rollout.max_context_window]
    if config.eval.held_out == "maps" and holds_out_maps(config.env.name, config.env.options):
        payload["held_out"] = "maps"  # its demonstrations never play a validation map
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


Report = Callable[[str], None]
LOGGER = logging.getLogger("ragen.bootstrap")


def _quiet(text: str) -> None:
    """The default :data:`Report`: says nothing."""


def bootstrap_model(
    config: RunConfig, lake: DataLake, base_dir: Path, report: Report = _quiet
) -> tuple[Path, dict[str, Any]]:
    """Return the bootstrapped model folder (building it if needed) and the bootstrap's summary. ``report`` hears a
    line per step of a build (the demonstrations, each SFT epoch)."""
    key = bootstrap_key(config, base_dir, lake.root)
    target, run_id = lake.bootstrap_model_dir(key), bootstrap_name(key)
    if not (target / "config.json").is_file():
        with open_run(lake, run_id, wait=True):  # another run building the same bootstrap: wait for it
            if not (target / "config.json").is_file():
                set_determinism(config)  # the run's thread count (it is set before the session's engines otherwise)
                target, summary = _build(config, lake, base_dir, target, run_id, report)
                check_reply_length(config, lake, run_id)
                return target, summary
    check_reply_length(config, lake, run_id)  # a cached model too: its key leaves the token limit out
    return target, {"run_id": run_id, "cached": True}


def check_reply_length(config: RunConfig, lake: DataLake, run_id: str) -> float:
    """The share of the bootstrap's demonstrated replies longer than ``rollout.max_new_tokens`` (their tokens, the
    end token included), warned of (logged) when there is any: the model learns replies it can never finish within
    the limit, and with the strict reply format every one of them is a format error."""
    limit = config.rollout.max_new_tokens
    (row,) = query(
        lake,
        "SELECT max(response_tokens) AS longest, avg((response_tokens > $limit)::int) AS over FROM turns "
        "WHERE run_id = $run",
        params={"limit": limit, "run": run_id},
    ).to_pylist()
    over = float(row["over"] or 0.0)
    if over > 0:
        message = (
            f"bootstrap: {over:.0%} of the demonstrated replies are longer than rollout.max_new_tokens={limit} "
            f"(the longest {row['longest']} tokens, the end token included): the policy learns replies it "
            f"cannot finish; set rollout.max_new_tokens={row['longest']} or more"
        )
        LOGGER.warning(message)
    return over


def _build(
    config: RunConfig, lake: DataLake, base_dir: Path, target: Path, run_id: str, report: Report
) -> tuple[Path, dict[str, Any]]:
    """Demonstrations, their SFT, and the model saved to ``target`` (the bootstrap run's lock held)."""
    model, tokenizer = load_policy(base_dir)
    settings, started = config.bootstrap, time.monotonic()
    report(
        f"bootstrap {run_id}: {settings.num_groups * settings.group_size} demonstrations of the "
        f"{settings.policy} scripted policy on {config.env.name}, then {settings.epochs} SFT epoch(s)"
    )
    _demonstrations(config, lake, run_id, tokenizer, prompt_context(config, model))
    report(f"bootstrap: demonstrations stored ({time.monotonic() - started:.0f} s)")
    maybe_fail("bootstrap", "demos")  # demonstrations published; no model yet
    # The supervised step is offline re-training (ragen_core.run.offline) on the demonstration run, selected by SQL:
    # the stored token ids exactly, checked against the model's tokenizer.
    manifest = RunManifest(
        run_id=run_id,
        kind="bootstrap",
        config=config.to_dict(),
        config_hash=config.config_hash(),
        base_model=str(base_dir),
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        model_dir=str(target),
        versions=library_versions(),
        status="running",
        created_at=utc_now(),
        updated_at=utc_now(),
    )
    lake.write_manifest(run_id, manifest)
    demos = select_trajectories(lake, "SELECT * FROM trajectories WHERE run_id = ?", params=[run_id])
    check_tokenizer(lake, [run_id], tokenizer)
    history = _supervised(config, ActorEngine(model, _sft_optim(config)), demos, tokenizer, target, report)
    summary = {
        "run_id": run_id,
        "cached": False,
        "demonstrations": demos.num_rows,
        "sft_loss_first": history[0]["sft/loss"],
        "sft_loss_last": history[-1]["sft/loss"],
    }
    lake.write_manifest(run_id, manifest.updated(status="completed", summary=summary, updated_at=utc_now()))
    lake.commit_iteration(run_id, 0, summary)
    return target, summary


def _demonstrations(
    config: RunConfig, lake: DataLake, run_id: str, tokenizer: Any, context_tokens: int | None
) -> None:
    """The scripted policy's demonstrations through the batch pipeline (staged, validated, published); a prompt
    longer than the model's ``context_tokens`` is refused."""
    settings = config.bootstrap
    formatter = chat_formatter(config, tokenizer, context_tokens)
    seed = bootstrap_seed(config)
    seeds = derive_seeds(seed, settings.num_groups, "bootstrap")
    spec = rollout_spec(config, config.env.name, seeds, settings.group_size, "train")
    backend = ScriptedBackend(settings.policy, tokenizer, scripted_options(config))
    records = run_rollouts(spec, backend, formatter, derive_seed(seed, "bootstrap"))
    meta = BatchMeta.demonstrations(run_id, config.config_hash())
    rules = BatchRules.of(config, config.env.name, settings.group_size)
    BatchPipeline(lake, meta, Stage.DEMOS, rules).run(records)


def _sft_optim(config: RunConfig) -> OptimConfig:
    return OptimConfig(
        lr=config.bootstrap.lr,
        weight_decay=0.0,
        grad_clip=config.actor.grad_clip,
        micro_batch_size=config.actor.micro_batch_size,
    )


def _supervised(
    config: RunConfig, actor: ActorEngine, demos: Any, tokenizer: Any, target: Path, report: Report
) -> list[dict[str, float]]:
    """``bootstrap.epochs`` supervised epochs on the demonstrations, then the model saved to ``target`` (built in a
    hidden sibling and renamed: a folder named ``target`` is always complete)."""
    settings = config.bootstrap
    seed = bootstrap_seed(config)
    history = []
    for epoch in range(settings.epochs):
        started = time.monotonic()
        seed_e = derive_seed(seed, "bootstrap_sft", epoch)
        history.append(sft_update(actor, demos, tokenizer.pad_token_id, settings.batch_size, seed_e))
        report(
            f"bootstrap: SFT epoch {epoch + 1}/{settings.epochs}, loss {history[-1]['sft/loss']:.3f} "
            f"({time.monotonic() - started:.0f} s)"
        )
    staging = building(target)
    shutil.rmtree(staging, ignore_errors=True)
    save_policy(actor.module, tokenizer, staging)
    try:
        os.rename(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return history
