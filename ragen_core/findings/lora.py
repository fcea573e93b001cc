"""The ``lora`` analysis: LoRA adapters at two ranks against full fine-tuning on the same config and seeds.

Per arm, as :func:`ragen_core.findings.studies.async_staleness` measures a schedule: validation success before RL and
at the end (held-out instances for the map envs), the wall minutes from the first commit to the last (``time/step``),
seconds per iteration and the success gained per wall minute; and what LoRA changes in the update: its seconds per
iteration (``time/update``; the parameters each arm trains and its optimizer state are measured by ``make bench``'s
``lora`` section). Each arm's final success is held against the full fine-tuning arm's spread over seeds
(``within_full_spread``: within its min..max).
"""

from __future__ import annotations

from typing import Any

from ragen_core.findings.analysis import Context, register, spread
from ragen_core.findings.figures import PANELS, VAL
from ragen_core.findings.studies import async_staleness, mark_within_spread

FULL = "full"  # the variant that fine-tunes every weight (actor.lora null)
UPDATE = "time/update"
PANELS.add(
    "lora",
    (
        (VAL, "time/step"),
        ("val_success_final", "wall_minutes", "success_gain_per_minute", "update_seconds_per_iteration"),
    ),
)


@register("lora")
def lora(ctx: Context) -> dict[str, Any]:
    """The arms' validation, wall time and update cost (module docstring), and ``within_full_spread`` with a
    ``full`` arm."""
    result = async_staleness(ctx)  # validation, wall minutes, seconds per iteration, success per wall minute
    arms: dict[str, dict[str, Any]] = {}
    for arm in ctx.arms:
        numbers = {k: v for k, v in result["arms"][arm.label].items() if not k.startswith("staleness")}
        numbers.pop("within_sync_spread", None)
        updates = [[v for _, v in ctx.series(run, UPDATE)] for run in arm.run_ids]
        numbers["update_seconds_per_iteration"] = spread([sum(u) / len(u) if u else None for u in updates])
        arms[arm.label] = numbers
    mark_within_spread(ctx, arms, FULL, "within_full_spread")
    return {"val_env": ctx.val_env, "arms": arms, "curves": result["curves"]}  # validation and time/step
