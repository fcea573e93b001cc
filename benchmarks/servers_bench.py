"""Rollouts on two vLLM servers against one at equal work, and the weight push to two servers against one.

    python -m benchmarks.servers_bench [--shape tiny] [--repeats 3] [--threads 1]

Throughput: the same rollouts (one env case, its seeds and sampling) through a server pool of one server and of two,
both with ``shards=2``, interleaved; groups per second on each side, ``two_over_one`` their ratio per repeat. Both
sides split each turn's requests into the same two parts, so both sample the same rollouts (``same_rollouts``: every
token and log-prob, checked). Push: a real demo run (configs/bandit.yaml, ``rollout.backend=vllm``) on one server
and on two (``rollout.vllm.servers=[local,local]``, shards 2): the seconds of every weight push and its share of
the iteration.

On one machine both servers share its cores, so the ratio here is what serving a part per server costs or saves
with no more hardware (on 2 CPU cores, two engines of one thread each against one engine of one thread, whose parts
run one after the other). Across hosts each server brings its own accelerator: the rollouts scale with the servers
while the parts keep them busy, and the push costs the slowest server's reload.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import interleave, ratio_of_rates, spread


@dataclass(frozen=True)
class ServersCase:
    """One side-by-side measurement: a model shape, an env case of benchmarks/rollout_bench.py and the batch."""

    shape: str
    case: str
    groups: int
    group_size: int
    repeats: int
    seed: int = 0


def _records(records: list[Any]) -> list[tuple]:
    return [(r.group_id, r.traj_index, r.input_ids, r.behavior_logprobs, r.loss_mask) for r in records]


def measure(case: ServersCase, servers: list[Any], tokenizer: Any) -> dict[str, Any]:
    """Interleaved repeats of one server against two (both pools with two shards) on one rollout case."""
    from benchmarks.rollout_bench import CASES, spec_for
    from ragen_core.agent import ChatFormatter
    from ragen_core.rollout import run_rollouts
    from ragen_core.rollout.vllm_backend import ServerPool, VLLMBackend

    max_new_tokens = CASES[case.case][4]
    spec = spec_for(case.case, case.groups, case.group_size, case.seed)
    formatter = ChatFormatter(tokenizer)
    backends = {
        "one": VLLMBackend(ServerPool(servers[:1], shards=2), tokenizer, 1.0, max_new_tokens),
        "two": VLLMBackend(ServerPool(servers, shards=2), tokenizer, 1.0, max_new_tokens),
    }
    sampled = {name: _records(run_rollouts(spec, backend, formatter, case.seed)) for name, backend in backends.items()}

    def side(backend: Any) -> Any:
        return lambda: len(run_rollouts(spec, backend, formatter, case.seed)) // case.group_size

    timings = interleave({name: side(backend) for name, backend in backends.items()}, case.repeats)
    rates = {name: [groups / seconds for seconds, groups in runs] for name, runs in timings.items()}
    return {
        "shape": case.shape,
        "case": case.case,
        "groups": case.groups,
        "group_size": case.group_size,
        "turns": CASES[case.case][1],
        **{f"{name}_seconds": [s for s, _ in runs] for name, runs in timings.items()},
        **{f"{name}_groups_per_s": spread(values) for name, values in rates.items()},
        "two_over_one": ratio_of_rates(rates["two"], rates["one"]),
        "same_rollouts": sampled["one"] == sampled["two"],
    }


def measure_pushes(data_root: Path, overrides: tuple[str, ...], threads: int) -> dict[str, Any]:
    """A demo run on one server and one on two: each push's seconds and share of its iteration."""
    from benchmarks.vllm_bench import measure_push

    sides = {"one": ("rollout.vllm.shards=2",), "two": ("rollout.vllm.servers=[local,local]", "rollout.vllm.shards=2")}
    found = {}
    for name, placed in sides.items():
        found[name] = measure_push(data_root / name, (*overrides, *placed), threads)
        found[name].pop("final", None)
    return found


def run(cases: list[ServersCase], data_root: Path, push_overrides: tuple[str, ...], threads: int) -> dict[str, Any]:
    """Every case, two servers per model shape, then the pushes at the demo's size."""
    from benchmarks.models import load, model_dir, parameter_count
    from ragen_core.rollout.vllm_local import VLLMServer, vllm_python

    results, params = [], {}
    for shape in dict.fromkeys(case.shape for case in cases):
        model, tokenizer = load(shape)
        params[shape] = parameter_count(model)
        folder = Path(tempfile.mkdtemp(prefix="servers-bench-"))
        servers: list[Any] = []
        try:
            for number in range(2):
                servers.append(VLLMServer.start(vllm_python(), model_dir(shape), folder, log_name=f"s{number}.log"))
            results.extend(measure(case, servers, tokenizer) for case in cases if case.shape == shape)
        finally:
            for server in servers:
                server.close()
        del model
    return {"cases": results, "parameters": params, "push": measure_pushes(data_root, push_overrides, threads)}


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="tiny")
    parser.add_argument("--case", default="sokoban")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="servers-bench-") as root:
        cases = [ServersCase(args.shape, args.case, 4, 8, args.repeats)]
        overrides = ("trainer.iterations=3", "eval.every=3", "eval.instances=16")
        print(json.dumps(run(cases, Path(root), overrides, args.threads), indent=2))


if __name__ == "__main__":
    main()
