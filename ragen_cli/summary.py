"""What a command prints after a run or a sweep: the iteration line, the bootstrap line, the run's summary (validation
success before and after, the SQL summary per environment and split) and the sweep's comparison table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from ragen_cli.common import console, print_table

if TYPE_CHECKING:
    from ragen_core.storage import DataLake

# One row per validated iteration, split and env (every iteration when the run never validated): a few rows, not one
# per iteration. The run id is a parameter ($run_id), never pasted into the SQL.
SUMMARY_SQL = (
    "SELECT iteration, split, env, count(*) AS trajectories, round(avg(total_reward), 4) AS reward, "
    "round(avg(success::int), 4) AS success, round(avg(truncated::int), 4) AS truncated FROM trajectories "
    "WHERE run_id = $run_id AND (iteration IN (SELECT iteration FROM trajectories WHERE run_id = $run_id AND "
    "split = 'val') OR NOT EXISTS (SELECT 1 FROM trajectories WHERE run_id = $run_id AND split = 'val')) "
    "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
)


def metrics_line(iteration: int, metrics: dict[str, float]) -> str:
    """The iteration's summary line (the same line goes to the run's logs in Prefect's UI)."""
    from ragen_core.monitor.reports import iteration_line

    return iteration_line(iteration, metrics)


def bootstrap_line(bootstrap: dict) -> str:
    """One readable line about the run's bootstrap (its model run, reused or built, and the SFT loss)."""
    from rich.markup import escape

    name = escape(str(bootstrap.get("run_id", "?")))
    if bootstrap.get("cached"):
        return f"bootstrap: {name} (reused)"
    parts = [f"bootstrap: {name}"]
    if "demonstrations" in bootstrap:
        parts.append(f"{bootstrap['demonstrations']} demonstrations")
    if "sft_loss_first" in bootstrap and "sft_loss_last" in bootstrap:
        parts.append(f"SFT loss {bootstrap['sft_loss_first']:.3f} -> {bootstrap['sft_loss_last']:.3f}")
    return ", ".join(parts)


def print_run_summary(
    lake: DataLake, run_id: str, bootstrap: dict | None, phases: str = "before RL -> after RL"
) -> None:
    """Validation success at the run's first and last validation (``phases`` names the two), its bootstrap and the
    SQL summary per environment and split."""
    from rich.markup import escape

    from ragen_core.storage import query

    success = query(
        lake,
        "SELECT iteration, name, value FROM metrics WHERE run_id = ? AND name LIKE 'val/%/success' "
        "ORDER BY iteration, name",
        params=[run_id],
    ).to_pylist()
    if success:
        first, last = success[0]["iteration"], success[-1]["iteration"]
        console.print(f"\n[bold]validation success[/] ({phases})")
        for name in sorted({row["name"] for row in success}):
            before = next(r["value"] for r in success if r["name"] == name and r["iteration"] == first)
            after = next(r["value"] for r in success if r["name"] == name and r["iteration"] == last)
            console.print(
                f"  {name.split('/')[1]:<16} iteration {first}: {before:.3f} -> iteration {last}: {after:.3f}"
            )
    _print_truncated(lake, run_id)
    if bootstrap:
        console.print(bootstrap_line(bootstrap), highlight=False)
    shown = SUMMARY_SQL.replace("$run_id", "'" + run_id.replace("'", "''") + "'")  # to copy; runs with a parameter
    console.print("\n[bold]SQL summary[/]: " + escape(shown), highlight=False)
    print_table(query(lake, SUMMARY_SQL, params={"run_id": run_id}))


TRUNCATED_NOTE = 0.05  # a final validation with more replies cut than this gets a warning line


def _print_truncated(lake: DataLake, run_id: str) -> None:
    """The share of the last validation's replies cut at the token limit, per env; a warning line where it exceeds
    :data:`TRUNCATED_NOTE` (a policy that no longer ends its replies is not usable, whatever its success)."""
    from ragen_core.storage import query

    rows = query(
        lake,
        "SELECT name, value FROM metrics WHERE run_id = ? AND name LIKE 'val/%/truncated_rate' AND iteration = "
        "(SELECT max(iteration) FROM metrics WHERE run_id = ? AND name LIKE 'val/%/truncated_rate') ORDER BY name",
        params=[run_id, run_id],
    ).to_pylist()
    if not rows:
        return
    shares = ", ".join(f"{row['name'].split('/')[1]} {row['value']:.3f}" for row in rows)
    console.print(f"  replies cut at the token limit (last validation): {shares}", highlight=False)
    worst = max(rows, key=lambda row: row["value"])
    if worst["value"] > TRUNCATED_NOTE:
        console.print(
            f"[yellow]warning:[/] {worst['value']:.0%} of the last validation's {worst['name'].split('/')[1]} replies "
            "never ended (cut at rollout.max_new_tokens): the trained policy runs on past its answer",
            highlight=False,
        )


def print_sweep(result: dict) -> None:
    """The sweep's comparison table; exit status 1 when some point did not complete."""
    import pyarrow as pa

    console.print("\n[bold]sweep comparison[/] (val_success: mean over validation envs at the last iteration)")
    print_table(pa.Table.from_pylist(result["points"]))
    removed = [row["run_id"] for row in result["points"] if row["status"] == "removed"]
    failed = [row["run_id"] for row in result["points"] if row["status"] not in ("completed", "removed")]
    if removed:
        console.print(
            f"[yellow]removed while the sweep ran:[/] {', '.join(removed)}; their runs are gone from the "
            "data root (the same command again trains them anew)"
        )
    if failed:
        console.print(f"[yellow]not completed:[/] {', '.join(failed)}; run the same command again to resume them")
    if removed or failed:
        raise typer.Exit(code=1)
