"""A peer side by side: TRL's ``GRPOTrainer`` and our ``train`` flow on the same Bandit task, interleaved.

Both start from the same bootstrapped tiny model and see the same prompts (our Bandit first-turn prompts, rendered
with the model's chat template by our engine and handed to TRL as text that re-tokenises to the same ids, checked),
the same reward (our Bandit env's reward plus the format penalty, computed with our parser), 16 generations per
prompt, 8 prompts per iteration, updates in mini-batches of 16, Hugging Face ``generate`` (no vLLM), 32 new tokens,
fp32, lr 1e-3, AdamW, clip 0.2 / 0.28, no KL, token-mean loss, group-standardised advantages. Two pairings:
``filter_ratio=1.0`` (equal work: both train on all 128 rollouts, 8 optimizer steps per iteration) and our
recommended StarPO-S (the demo config: the variance filter keeps 25% of the groups, so 2 steps on 32 rollouts; TRL has
no such filter and still trains on all 128).

Interleaving: TRL trains in a worker thread that pauses at the start of each generation cycle; after each of our
iterations the main thread lets TRL run exactly one cycle (one generation + 8 optimizer steps) and waits for it, so
the two never run at the same time and both see the same machine load. Validation: both policies are scored by the
same evaluator (our validation rollouts on the same fixed instances and sampling seeds) after the same number of
updates; evaluation time is excluded from both sides' training time.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, spread

WAIT_S = 1800.0  # how long either side waits for the other before giving up


@dataclass(frozen=True)
class PeerCase:
    """The side-by-side run: iterations, validation cadence and size, threads and where the data goes."""

    iterations: int
    eval_every: int
    eval_instances: int
    data_root: Path
    threads: int
    filter_ratio: float = 1.0  # 1.0: equal work with TRL; 0.25: our StarPO-S demo config
    extra: tuple[str, ...] = ()  # further overrides shared with the other flow runs (e.g. a smaller bootstrap)


def case_overrides(case: PeerCase) -> list[str]:
    """Our run's overrides on configs/bandit.yaml (the variance filter off, so both sides train on all 128)."""
    return [
        f"algorithm.filter_ratio={case.filter_ratio}",
        f"trainer.iterations={case.iterations}",
        f"trainer.num_threads={case.threads}",
        f"eval.every={case.eval_every}",
        f"eval.instances={case.eval_instances}",
        "env.val_envs=[bandit,bandit_test]",
        *case.extra,
    ]


class Lockstep:
    """Hands control between the main thread and TRL's training thread, one generation cycle at a time."""

    def __init__(self, steps_per_cycle: int) -> None:
        self.steps_per_cycle = steps_per_cycle
        self._go, self._paused = threading.Semaphore(0), threading.Semaphore(0)
        self.cycle_seconds: list[float] = []
        self._started = 0.0
        self.error: BaseException | None = None

    def pause(self, first: bool) -> None:
        """Called from TRL's thread at a cycle boundary: report the cycle just run, then wait for the next go."""
        if not first:
            self.cycle_seconds.append(time.perf_counter() - self._started)
        self._paused.release()
        if not self._go.acquire(timeout=WAIT_S):
            raise TimeoutError("the benchmark's main thread never resumed TRL")
        self._started = time.perf_counter()

    def finish(self) -> None:
        """Called from TRL's thread when training ends (or fails)."""
        self.cycle_seconds.append(time.perf_counter() - self._started)
        self._paused.release()

    def wait_paused(self, thread: threading.Thread) -> None:
        """Main thread: wait until TRL's thread has paused (or ended)."""
        deadline = time.monotonic() + WAIT_S
        while not self._paused.acquire(timeout=1.0):
            if not thread.is_alive() or time.monotonic() > deadline:
                break
        if self.error is not None:
            raise RuntimeError(f"TRL's training thread failed: {self.error!r}") from self.error

    def run_cycle(self, thread: threading.Thread) -> float:
        """Main thread: let TRL run one cycle; its seconds."""
        count = len(self.cycle_seconds)
        self._go.release()
        self.wait_paused(thread)
        if len(self.cycle_seconds) != count + 1:
            raise RuntimeError("TRL's training thread ended before its cycle finished")
        return self.cycle_seconds[-1]


def lockstep_callback(lockstep: Lockstep) -> Any:
    """A transformers ``TrainerCallback`` pausing TRL at every generation cycle's first optimizer step."""
    from transformers import TrainerCallback

    class _Callback(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step % lockstep.steps_per_cycle == 0:
                lockstep.pause(first=state.global_step == 0)

    return _Callback()


def prompt_rows(config: Any, tokenizer: Any, iterations: int) -> tuple[list[dict[str, Any]], bool]:
    """Our first-turn prompts of every iteration's env seeds, as text, plus whether TRL's tokenisation of that text
    gives exactly our ids."""
    from ragen_core.agent import ChatFormatter, reply_prefix
    from ragen_core.rollout import ScriptedBackend, run_rollouts
    from ragen_core.run.stages import rollout_spec
    from ragen_core.seeding import derive_seeds

    rows, same_ids = [], True
    for iteration in range(iterations):
        seeds = derive_seeds(config.seed, config.rollout.env_groups, iteration, "env_seeds")
        records = run_rollouts(
            rollout_spec(config, config.env.name, seeds, 1, "train"),
            ScriptedBackend("random", tokenizer),
            ChatFormatter(
                tokenizer, reply_prefix=reply_prefix(config.rollout.enable_think, config.rollout.think_prefix)
            ),
            0,
        )
        for seed, record in zip(seeds, records, strict=True):
            ids = record.input_ids[: record.loss_mask.index(1)]
            text = tokenizer.decode(ids)
            same_ids &= tokenizer(text)["input_ids"] == ids
            rows.append({"prompt": text, "env_seed": seed})
    return rows, same_ids


def bandit_reward(config: Any) -> Any:
    """TRL reward function: our env's reward for the reply plus the format penalty, as our engine scores a turn."""
    from ragen_core.agent import parse_response, reply_prefix, turn_penalty
    from ragen_core.envs import make_env

    budget = min(config.env.max_actions_per_turn, config.env.max_actions_per_traj)
    prefix = reply_prefix(config.rollout.enable_think, config.rollout.think_prefix)

    def reward(prompts: list[str], completions: list[str], env_seed: list[int], **kwargs: Any) -> list[float]:
        scores = []
        for text, seed in zip(completions, env_seed, strict=True):
            env = make_env(config.env.name, **config.env.options)
            env.reset(int(seed))
            # the prompt ends with the reply prefix (e.g. "<think>"): the reply is the prefix and the completion
            # TRL does not tell a reward function whether a completion was cut: read as finished
            parsed = parse_response(
                prefix + text, env.parse_action, budget, config.rollout.enable_think, config.rollout.reply_format
            )
            total = 0.0
            for action in parsed.actions:
                _, step_reward, terminated, truncated, _ = env.step(action)
                total += step_reward
                if terminated or truncated:
                    break
            scores.append(total + turn_penalty(parsed, config.rollout.format_penalty))
        return scores

    reward.__name__ = "bandit_reward"
    return reward


def grpo_trainer(config: Any, model_dir: Path, rows: list[dict[str, Any]], output_dir: Path, device: str) -> Any:
    """TRL's GRPOTrainer with our run's settings (see the module docstring)."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from ragen_core.policy import load_policy

    model, tokenizer = load_policy(model_dir)
    rollout, actor, algorithm = config.rollout, config.actor, config.algorithm
    batch = rollout.env_groups * rollout.group_size
    args = GRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=actor.mini_batch_size,
        gradient_accumulation_steps=1,
        steps_per_generation=batch // actor.mini_batch_size,
        num_generations=rollout.group_size,
        max_completion_length=rollout.max_new_tokens,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        learning_rate=actor.lr,
        weight_decay=actor.weight_decay,
        max_grad_norm=actor.grad_clip,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        beta=0.0,
        epsilon=algorithm.clip_low,
        epsilon_high=algorithm.clip_high,
        loss_type="bnpo",
        scale_rewards="group",
        num_iterations=1,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=device == "cpu",
        max_steps=config.trainer.iterations * (batch // actor.mini_batch_size),
        shuffle_dataset=False,
        seed=config.seed,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_vllm=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=bandit_reward(config),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)  # TRL still logs every 10 steps (its default); it just does not print
    return trainer


def validation_success(model: Any, tokenizer: Any, config: Any, updates: int, env_name: str) -> float:
    """Success of ``model`` on the run's fixed validation instances, sampled exactly as our evaluate stage samples
    after ``updates`` updates (same instances, temperature and sampling seed)."""
    from ragen_core.agent import ChatFormatter, reply_prefix
    from ragen_core.rollout import run_rollouts
    from ragen_core.rollout.hf_backend import HFBackend
    from ragen_core.run.stages import rollout_spec
    from ragen_core.seeding import derive_seed, derive_seeds

    seeds = derive_seeds(config.eval.seed, config.eval.instances, "val", env_name)
    spec = rollout_spec(config, env_name, seeds, config.eval.k, "val")
    backend = HFBackend(
        model,
        tokenizer,
        config.eval.temperature,
        config.rollout.max_new_tokens,
        config.rollout.top_p,
        config.rollout.top_k,
    )
    records = run_rollouts(
        spec,
        backend,
        ChatFormatter(tokenizer, reply_prefix=reply_prefix(config.rollout.enable_think, config.rollout.think_prefix)),
        derive_seed(config.seed, updates, "eval", env_name),
    )
    return sum(r.success for r in records) / len(records)


def measure(case: PeerCase, device: str = "cpu") -> dict[str, Any]:
    """Run both side by side; per-iteration wall times, validation curves and success gained per minute."""
    from benchmarks.flow_bench import FlowCase, run_flow
    from ragen_core.run.bootstrap import bootstrap_model
    from ragen_core.run.checks import load_run_config as load_config
    from ragen_core.run.session import base_model_dir
    from ragen_core.storage import DataLake

    overrides = case_overrides(case)
    config = load_config(ROOT / "configs" / "bandit.yaml", overrides)
    lake = DataLake(case.data_root)
    start_dir, _ = bootstrap_model(config, lake, base_model_dir(config, lake))  # the flow finds it cached
    env_name = config.env.name
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as output_dir:
        probe_tokenizer = load_tokenizer_only(start_dir)
        rows, same_ids = prompt_rows(config, probe_tokenizer, config.trainer.iterations)
        trainer = grpo_trainer(config, start_dir, rows, Path(output_dir), device)
        steps = trainer.args.steps_per_generation
        lockstep = Lockstep(steps)
        trainer.add_callback(lockstep_callback(lockstep))
        trl_success = {0: validation_success(trainer.model, trainer.processing_class, config, 0, env_name)}

        def train_trl() -> None:
            try:
                trainer.train()
            except BaseException as exc:  # reported by the main thread
                lockstep.error = exc
            finally:
                lockstep.finish()

        thread = threading.Thread(target=train_trl, name="trl-grpo", daemon=True)
        thread.start()
        lockstep.wait_paused(thread)  # TRL's set-up is done before our first iteration starts
        trl_seconds: list[float] = []

        def after_ours(iteration: int, metrics: dict[str, float]) -> None:
            if iteration >= config.trainer.iterations:
                return
            trl_seconds.append(lockstep.run_cycle(thread))
            updates = iteration + 1
            if updates % config.eval.every == 0 or updates == config.trainer.iterations:
                model = trainer.model
                trl_success[updates] = validation_success(model, trainer.processing_class, config, updates, env_name)

        label = f"peer-filter-{case.filter_ratio:g}"
        ours_rows, final = run_flow(FlowCase(label, tuple(overrides), case.data_root), progress=after_ours)
        lockstep._go.release()  # let TRL's thread finish its loop
        thread.join(timeout=60)
    return summarise(config, ours_rows, final, trl_seconds, trl_success, same_ids, steps)


def load_tokenizer_only(model_dir: Path) -> Any:
    from ragen_core.policy.loading import load_tokenizer

    return load_tokenizer(model_dir)


def summarise(
    config: Any,
    ours_rows: list[dict[str, Any]],
    final: dict[str, float],
    trl_seconds: list[float],
    trl_success: dict[int, float],
    same_ids: bool,
    steps: int,
) -> dict[str, Any]:
    """Per-iteration times (ours without its validation stage), the time ratio, and success gained per minute."""
    env = config.env.name
    ours_train = [r["wall_s"] - r["stage_s"].get("evaluate", 0.0) for r in ours_rows]
    ours_success = {r["iteration"]: r["metrics"][f"val/{env}/success"] for r in ours_rows if r["evaluated"]}
    if f"val/{env}/success" in final:
        ours_success[config.trainer.iterations] = final[f"val/{env}/success"]
    n = min(len(ours_train), len(trl_seconds))
    ratios = [ours_train[i] / trl_seconds[i] for i in range(n)]

    def per_minute(success: dict[int, float], seconds: list[float]) -> dict[str, Any]:
        updates = sorted(success)
        minutes = {u: sum(seconds[:u]) / 60.0 for u in updates}
        last = updates[-1]
        gain = success[last] - success[updates[0]]
        return {
            "curve": [{"updates": u, "train_minutes": minutes[u], "success": success[u]} for u in updates],
            "success_gain_per_minute": gain / minutes[last] if minutes[last] else float("nan"),
            "final_success": success[last],
            "train_minutes": minutes[last],
        }

    return {
        "iterations": n,
        "filter_ratio": config.algorithm.filter_ratio,
        "optimizer_steps_per_iteration": steps,
        "prompt_ids_identical": same_ids,
        "ours_iteration_s": spread(ours_train[:n]),
        "trl_iteration_s": spread(trl_seconds[:n]),
        "ours_over_trl_per_iteration": spread(ratios),
        "trl_iteration_time_ratio": spread(ours_train[:n])["median"] / spread(trl_seconds[:n])["median"],
        "ours": per_minute(ours_success, ours_train),
        "trl": per_minute(trl_success, trl_seconds),
        "ours_stage_s": stage_medians(ours_rows[:n]),
    }


def stage_medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Where our iterations' time goes: median seconds of each stage's task call (validation excluded), and of what
    lies outside every stage (the flow's glue)."""
    stages = sorted({name for row in rows for name in row["stage_s"] if name != "evaluate"})
    medians = {name: statistics.median(row["stage_s"].get(name, 0.0) for row in rows) for name in stages}
    outside = [row["wall_s"] - sum(row["stage_s"].values()) for row in rows]
    medians["outside stages"] = statistics.median(outside) if outside else 0.0
    return medians
