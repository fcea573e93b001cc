"""The host's share of an iteration, before and after the one token path (issue 49, item 3), side by side.

The host's work of an iteration is what it does between the model's: the batch's Parquet staging, the data
contracts, the filter (with its entropy estimate) and the publish (``time/persist``, ``time/validate``,
``time/filter``), and the update's reading of its inputs from the lake (``update_inputs``: the kept rows read, their
tokens padded into tensors, turn rows cut). Its share is that time over the iteration's wall time (``time/step``).

Each side is a real training run through the Python API (``ragen_core.train``, bootstrap off, the tiny model, one
torch thread) at the shipped configs' shapes, in a process whose import path holds one checkout: the working tree
("after") or an export of an earlier commit ("before", by default the last one before the token path changed).
After the run the same process times ``update_inputs`` of each measured iteration on the run's own lake. Runs
interleave (before, after, after, before, ...), so each ratio compares neighbours on the same machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import spread
from benchmarks.models import model_dir

ROOT = Path(__file__).resolve().parent.parent
# The token path before issue 49's item 3: ``.to_pylist()`` in the turn rows and the run layer, trajectories staged
# by persist and staged again by the filter.
BEFORE = "5dc57a5bdb28e13d4feb54c61169d5373f2676e7"
HOST = ("time/persist", "time/validate", "time/filter")
COMMON = (
    "bootstrap.enabled=false",
    "trainer.num_threads=1",
    "trainer.checkpoint_every=1000",
    "eval.every=1000",
    "eval.instances=2",
    "monitor.trackers=[]",
)
SHAPES = {
    # the demo: Bandit, 8 x 16 one-turn rollouts, StarPO-S's reward-variance filter
    "demo": ("configs/bandit.yaml", ()),
    # multi-turn Sokoban as shipped: 16 x 8 rollouts of up to 10 turns, each row packing one window per turn
    "sokoban": ("configs/sokoban.yaml", ()),
    # the same with RAGEN-2's per-turn training rows and the entropy-variance filter on the stored log-probs
    "sokoban_turn_rows": (
        "configs/sokoban.yaml",
        ("rollout.training_rows=turn", "algorithm.filter=top_k", "algorithm.filter_metric=entropy_variance"),
    ),
}

# One side's run, executed with one checkout on the import path (the code of either side has these entry points).
WORKER = """
import json, sys, time
args = json.loads(sys.argv[1])
import ragen_core
from transformers import AutoTokenizer
from ragen_core.run.requests import resolve_config
from ragen_core.storage import DataLake
from ragen_core.update.inputs import update_inputs
ragen_core.train(args["config"], args["root"], "host", args["overrides"])
config = resolve_config(args["config"], args["overrides"])
lake, pad = DataLake(args["root"]), AutoTokenizer.from_pretrained(args["model"]).pad_token_id
metrics = lake.read_table("metrics", "host").to_pylist()
out = []
for i in args["measured"]:
    inputs = []
    for _ in range(3):
        started = time.perf_counter()
        update_inputs(lake, "host", i, config, pad)
        inputs.append(time.perf_counter() - started)
    row = {m["name"]: m["value"] for m in metrics if m["iteration"] == i}
    out.append({**{k: row.get(k, 0.0) for k in args["keys"]}, "inputs": min(inputs)})
print(json.dumps(out))
"""


@dataclass(frozen=True)
class HostCase:
    """The shapes measured, the iterations of each run (the first is left out: warm-up), the interleaved pairs and
    the folder for the runs' data roots and the exported checkout."""

    shapes: tuple[str, ...]
    iterations: int
    pairs: int
    data_root: Path
    before: str = BEFORE


def export_checkout(ref: str, into: Path) -> Path:
    """The tree of commit ``ref`` of this repository, exported (``git archive``) into a folder of ``into``."""
    folder = into / f"checkout-{ref[:12]}"
    if not folder.is_dir():
        archive = into / "checkout.tar"
        subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), ref], check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(folder, filter="data")
        archive.unlink()
    return folder


def run_side(code: Path, shape: str, case: HostCase, label: str) -> list[dict[str, float]]:
    """One run of ``shape`` with ``code`` on the import path; per measured iteration, its host parts and step."""
    config, extra = SHAPES[shape]
    root = Path(tempfile.mkdtemp(prefix=f"host-{shape}-{label}-", dir=case.data_root))
    model = model_dir("tiny")
    args = {
        "config": str(code / config),
        "root": str(root),
        "model": str(model),
        "overrides": [*COMMON, *extra, f"trainer.iterations={case.iterations}", f"model.path={model}"],
        "measured": list(range(1, case.iterations)),
        "keys": [*HOST, "time/step"],
    }
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", WORKER, json.dumps(args)]
    done = subprocess.run(command, env=env, cwd=code, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {label} run of {shape} failed ({code}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    """Mean seconds per iteration of each host part, their sum and its share of the step."""
    parts = {key: sum(r[key] for r in rows) / len(rows) for key in (*HOST, "inputs", "time/step")}
    host = sum(parts[key] for key in (*HOST, "inputs"))
    return {**parts, "host_s": host, "host_share": host / parts["time/step"]}


def run_host(case: HostCase) -> dict[str, Any]:
    """Every shape, ``pairs`` interleaved before/after pairs: each side's host seconds and share, and after / before
    of the host seconds (with its range over the pairs)."""
    before = export_checkout(case.before, case.data_root)
    out: dict[str, Any] = {"before": case.before, "shapes": list(case.shapes), "iterations": case.iterations}
    for shape in case.shapes:
        sides: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for pair in range(case.pairs):
            order = ("before", "after") if pair % 2 == 0 else ("after", "before")
            for side in order:
                code = before if side == "before" else ROOT
                sides[side].append(summary(run_side(code, shape, case, f"{side}{pair}")))
        ratios = [a["host_s"] / b["host_s"] for a, b in zip(sides["after"], sides["before"], strict=True)]
        out[shape] = {
            **{
                f"{side}.{key}": spread([r[key] for r in runs])["median"]
                for side, runs in sides.items()
                for key in ("host_s", "host_share", "time/step", *HOST, "inputs")
            },
            "host_ratio": spread(ratios),
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    """The host's section of RESULTS.md."""
    lines = [
        "## Host share of an iteration (`benchmarks/host_bench.py`)",
        "",
        f"The host's work per iteration (staging and publishing the batch, the data contracts, the filter, and the "
        f"update's reading of its inputs: `update_inputs`) in seconds and as a share of the iteration's wall time "
        f"(`time/step`), before the one token path (commit `{result['before'][:12]}`) and after it, each a real "
        f"training run (tiny model, one torch thread, bootstrap off; the first iteration left out), interleaved "
        f"pairs.",
        "",
        "| shape | host s before | host s after | after / before [min-max] | share before | share after | step s "
        "before, after |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape in result["shapes"]:
        row = result[shape]
        ratio = row["host_ratio"]
        lines.append(
            f"| {shape} | {row['before.host_s']:.3f} | {row['after.host_s']:.3f} | {ratio['median']:.2f} "
            f"[{ratio['min']:.2f}-{ratio['max']:.2f}] (n={ratio['n']}) | {row['before.host_share']:.1%} "
            f"| {row['after.host_share']:.1%} | {row['before.time/step']:.2f}, {row['after.time/step']:.2f} |"
        )
    lines += ["", "By part (seconds per iteration, before -> after):", ""]
    for shape in result["shapes"]:
        row = result[shape]
        parts = ", ".join(
            f"{key.removeprefix('time/')} {row[f'before.{key}']:.3f} -> {row[f'after.{key}']:.3f}"
            for key in (*HOST, "inputs")
        )
        lines.append(f"- {shape}: {parts}")
    return "\n".join(lines) + "\n"
