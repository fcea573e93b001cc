"""The launched update group against the in-process update: the same update on the same batch, side by side.

    python -m benchmarks.group_bench [--shape 20m] [--repeats 3] [--threads 1]

In-process: the update stage's core call, :func:`ragen_core.run.stages.update_policy`, with the engines in this
process (the rollouts sample from the actor's own module: nothing to hand over). Group: the same call's two halves
with the engines in a group started by ``torchrun`` (one process): the update command, then the new weights into
this process's rollout copy (:meth:`LaunchedUpdater.sync`, through the shared-memory buffer). A third side, "export",
hands them over as the group did before (a Hugging Face export written by the group and loaded here). All three
update on the same stored batch (configs/bandit.yaml's: 128 rollouts, 25% of the groups kept), with the same
threads, interleaved. ``launched_group_update_ratio`` is the group's time over the in-process time, per repeat.

The group's reply says where its time went (``update_s``: the update on the rank; ``handoff_s``: the weights into
the buffer); this process adds the copy into the rollout model (``sync_s``); the rest of the group's time is the
command's round trip (JSON over the socket, the broadcast to the ranks).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.common import interleave, shape_bench_main, spread


@dataclass(frozen=True)
class GroupCase:
    """One side-by-side measurement: a model shape, the repeats and the torch threads of both sides."""

    shape: str
    repeats: int
    threads: int
    launcher: str = "torchrun"


@dataclass
class RolloutCopy:
    """The run's rollout side as a launched session holds it: a separate copy of the policy, no sampler to hand the
    new weights on to (:class:`ragen_core.training.updater.RolloutSide`)."""

    model: torch.nn.Module

    def take(self, weights: Any) -> None:
        """No sampler reads anything but the copy."""


def measure(case: GroupCase) -> dict[str, Any]:
    """Interleaved repeats of the in-process update, the group's update with the shared-memory hand-off and with the
    export hand-off, on one stored batch; ratios, the group's time breakdown and both sides' thread settings."""
    from benchmarks.models import model_dir, parameter_count
    from benchmarks.update_bench import UpdateCase, bench_config, make_batch
    from ragen_core.run import stages
    from ragen_core.run.checks import build_run_config
    from ragen_core.run.iteration import IterationState
    from ragen_core.run.session import open_session
    from ragen_core.storage import DataLake
    from ragen_core.training.checkpoint import load_exported_weights
    from ragen_core.training.updater import LaunchedUpdater

    folder = model_dir(case.shape)
    config = bench_config(UpdateCase(case.shape, folder, case.repeats, case.threads))
    launched_config = build_run_config(config.to_dict(), [f"trainer.launcher={case.launcher}"])
    parts: dict[str, list[float]] = {"update_s": [], "handoff_s": [], "sync_s": [], "round_trip_s": []}
    with tempfile.TemporaryDirectory(prefix="group-bench-") as root:
        lake = DataLake(root)
        session = open_session(config, lake, f"group-bench-{case.shape}", folder)
        group = None
        try:
            make_batch(session, 0)
            group = LaunchedUpdater.start(launched_config, lake, session.run_id, folder, "fp32")
            rollout = RolloutCopy(group.rollout_policy(folder, torch.float32)[0])

            def inprocess() -> int:
                return int(stages.update_policy(session, 0, IterationState())["actor/trained_tokens"])

            def shared() -> int:
                started = time.perf_counter()
                metrics = group.update(0)
                synced = time.perf_counter()
                group.sync(rollout)
                ended = time.perf_counter()
                timing = group.group.last_timing
                parts["update_s"].append(timing["update_s"])
                parts["handoff_s"].append(timing["handoff_s"])
                parts["sync_s"].append(ended - synced)
                parts["round_trip_s"].append(synced - started - timing["update_s"] - timing["handoff_s"])
                return int(metrics["actor/trained_tokens"])

            def export() -> int:  # the hand-off before the shared buffer: an export written, then loaded here
                metrics, weights = group.group.update(0, export=True)
                load_exported_weights(rollout.model, weights)
                return int(metrics["actor/trained_tokens"])

            for side in (inprocess, shared, export):  # warm-up: first-step allocations, optimizer state
                side()
            for values in parts.values():
                values.clear()
            timings = interleave({"inprocess": inprocess, "group": shared, "export": export}, case.repeats)
            threads = {"inprocess": torch.get_num_threads(), "group": group.group.ready.get("threads")}
            parameters = parameter_count(rollout.model)
        finally:
            if group is not None:
                group.close()
            session.close() if hasattr(session, "close") else None
    return summarise(case, timings, parts, threads, parameters)


def summarise(
    case: GroupCase,
    timings: dict[str, list[tuple[float, int]]],
    parts: dict[str, list[float]],
    threads: dict[str, Any],
    parameters: int,
) -> dict[str, Any]:
    """Per-repeat ratios (group / in-process, export / in-process), the sides' seconds and the group's breakdown."""
    seconds = {side: [s for s, _ in runs] for side, runs in timings.items()}
    tokens = {result for runs in timings.values() for _, result in runs}
    return {
        "shape": case.shape,
        "parameters": parameters,
        "launcher": case.launcher,
        "repeats": case.repeats,
        "same_tokens": len(tokens) == 1,
        "trained_tokens": next(iter(tokens)),
        "seconds": {side: spread(values) for side, values in seconds.items()},
        "ratio": spread([g / i for g, i in zip(seconds["group"], seconds["inprocess"], strict=True)]),
        "export_ratio": spread([e / i for e, i in zip(seconds["export"], seconds["inprocess"], strict=True)]),
        "group_breakdown_s": {name: spread(values) for name, values in parts.items() if values},
        "threads": threads,
        "raw_seconds": seconds,
    }


def main() -> None:
    shape_bench_main(
        __doc__,
        lambda shape, repeats, threads: measure(GroupCase(shape, repeats, threads)),
        "torch threads of both sides.",
    )


if __name__ == "__main__":
    main()
