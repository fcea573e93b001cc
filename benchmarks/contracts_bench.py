"""Data contracts: seconds of one validate call on a real batch, the vectorised checks (what every batch gets) vs the
library reference (pandera + great-expectations), interleaved in one process.

The batch is the demo's (configs/bandit.yaml: env groups x group size rollouts of the tiny model, 32 new tokens),
staged as Parquet and read back as the validate stage reads it; both sides call
:func:`schemas.contracts.validate_trajectory_batch` on it with the env's bounds and success rule, and both must pass
it. Each side's first call is reported apart (the libraries import great-expectations and build their context
there). ``python -m benchmarks.contracts_bench [--env bandit|sokoban] [--groups G] [--group-size S] [--repeats N]``
prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, interleave, quiet_libraries, spread

ENGINES = ("vectorised", "libraries")


@dataclass(frozen=True)
class ContractsCase:
    """One measurement: the env (its configs/<env>.yaml), the batch shape and the repeats."""

    env: str = "bandit"
    groups: int = 8
    group_size: int = 16
    repeats: int = 7
    seed: int = 0


def staged_batch(case: ContractsCase, folder: Path) -> tuple[Any, Any, Any]:
    """(trajectories, turns, rules) of one batch of ``case`` written to ``folder`` as Parquet and read back."""
    import pyarrow.parquet as pq

    from benchmarks.models import load
    from ragen_core.agent import ChatFormatter
    from ragen_core.rollout import run_rollouts
    from ragen_core.rollout.hf_backend import HFBackend
    from ragen_core.rollout.records import BatchMeta, trajectories_table, turns_table
    from ragen_core.run.batches import BatchRules
    from ragen_core.run.checks import load_run_config as load_config
    from ragen_core.run.stages import rollout_spec

    config = load_config(ROOT / "configs" / f"{case.env}.yaml", [])
    model, tokenizer = load("tiny")
    spec = rollout_spec(config, case.env, list(range(case.groups)), case.group_size, "train")
    backend = HFBackend(model, tokenizer, config.rollout.temperature, config.rollout.max_new_tokens)
    records = run_rollouts(spec, backend, ChatFormatter(tokenizer), seed=case.seed)
    meta = BatchMeta(run_id="bench", iteration=0, split="train", policy_version=0, temperature=1.0, config_hash="b")
    for name, table in (("trajectories", trajectories_table(records, meta)), ("turns", turns_table(records, meta))):
        pq.write_table(table, folder / f"{name}.parquet")
    tables = [pq.read_table(folder / f"{name}.parquet") for name in ("trajectories", "turns")]
    return tables[0], tables[1], BatchRules.of(config, case.env, case.group_size)


def measure(case: ContractsCase) -> dict[str, Any]:
    """Seconds per validate call of each engine (first call apart), and libraries / vectorised per repeat."""
    from schemas.contracts import validate_trajectory_batch

    with tempfile.TemporaryDirectory() as folder:
        trajectories, turns, rules = staged_batch(case, Path(folder))

    def call(engine: str) -> Any:
        return lambda: validate_trajectory_batch(
            trajectories, turns, rules.group_size, rules.bounds, success_rule=rules.success_rule, engine=engine
        )

    first = {}
    for engine in ENGINES:
        started = time.perf_counter()
        report = call(engine)()
        first[engine] = time.perf_counter() - started
        if not report.ok:  # a batch our own rollouts wrote must pass, or the timing means nothing
            raise RuntimeError(f"the benchmark batch failed {report.failed_checks()} under {engine}")
    timed = interleave({engine: call(engine) for engine in ENGINES}, case.repeats)
    seconds = {engine: [s for s, _ in timed[engine]] for engine in ENGINES}
    speedups = [lib / vec for lib, vec in zip(seconds["libraries"], seconds["vectorised"], strict=True)]
    return {
        "case": case.__dict__,
        "trajectories": trajectories.num_rows,
        "turns": turns.num_rows,
        "tokens": sum(len(ids) for ids in trajectories["input_ids"].to_pylist()),
        "first_call_s": first,
        "seconds": {engine: spread(values) for engine, values in seconds.items()},
        "libraries_over_vectorised": spread(speedups),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="bandit", choices=["bandit", "sokoban"])
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    quiet_libraries()
    result = measure(ContractsCase(args.env, args.groups, args.group_size, args.repeats))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
