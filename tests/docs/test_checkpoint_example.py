"""The docs' `ragen eval <run id>@N` example names a checkpoint the demo's run still has under the default
checkpoint settings (issue 40, section 4 item 4: `@10` named one that `trainer.keep_last: 2` had deleted)."""

from __future__ import annotations

import re
from pathlib import Path

from ragen_core.run.checks import load_run_config

ROOT = Path(__file__).resolve().parents[2]


def _kept(iterations: int, every: int, keep_last: int) -> list[int]:
    """The updates whose checkpoints a run keeps: one every ``every`` updates and after the last, the newest
    ``keep_last`` of them."""
    saved = [u for u in range(1, iterations + 1) if u % every == 0 or u == iterations]
    return saved[-keep_last:]


def test_the_eval_example_names_a_checkpoint_the_demo_run_keeps():
    trainer = load_run_config(ROOT / "configs" / "bandit.yaml", []).trainer
    kept = _kept(trainer.iterations, trainer.checkpoint_every, trainer.keep_last)
    assert kept == [29, 30]  # the premise, by hand: 30 iterations, one checkpoint per update, the newest two kept
    usage = (ROOT / "docs" / "usage.md").read_text()
    examples = [int(n) for n in re.findall(r"ragen eval <run id>@(\d+)", usage)]
    assert examples and all(n in kept for n in examples)
    assert "run keeps @29 and @30" in usage.replace("\n", " ")
    extended = _kept(40, trainer.checkpoint_every, trainer.keep_last)
    assert f"@{extended[0]} and @{extended[1]}" in usage  # after the README's extension to 40 iterations
