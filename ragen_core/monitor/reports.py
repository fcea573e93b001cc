"""Human-readable summaries of an iteration's metrics (the Prefect artifacts render these; no Prefect here)."""

from __future__ import annotations

import functools
import hashlib
import re

from ragen_core.monitor.metrics import throughput_metrics

HEADLINE = (
    ("rollout/success_rate", "train success"),
    ("rollout/reward_mean", "reward mean"),
    ("rollout/in_group_reward_std", "in-group reward std"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad norm"),
    ("rollout/response_length", "response length"),
    ("rollout/truncated_rate", "replies cut at the token limit"),
)


# C0 and C1 control characters and DEL: a newline, an escape sequence (ESC [2J), a bell in a stored or free-form text
# would reach a terminal, a log line or Prefect's UI as another line or a screen command; written as \xNN instead
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)]}


def escape_controls(text: str, keep: str = "") -> str:
    """``text`` with every control character (newline, ESC, BEL, CR, ...; but those in ``keep``) written as a
    ``\\xNN`` escape: what a log line, an artifact cell or a terminal shows of text it did not write itself."""
    return text.translate(_table(keep))


@functools.cache
def _table(keep: str) -> dict[int, str]:
    return {c: escaped for c, escaped in _CONTROLS.items() if chr(c) not in keep}


def artifact_key(run_id: str, suffix: str = "metrics") -> str:
    """A Prefect artifact key for a run: lowercase letters, digits and dashes only (Prefect's rule), one key per run.

    A run id made of those already is its own stem; any other (``A.b``, ``a_b``, ``a--b``) is lowered to one and
    marked ``--`` plus 12 hex digits of its sha256, so ``A.b``, ``a_b`` and ``a-b`` never share a key (a plain stem
    never holds ``--``: the slug joins every run of other characters into one dash)."""
    stem = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-") or "run"
    if stem != run_id:
        stem = f"{stem}--{hashlib.sha256(run_id.encode()).hexdigest()[:12]}"
    return f"ragen-{stem}-{suffix}"


def _format(value: float) -> str:
    return f"{value:.4g}"


def iteration_markdown(run_id: str, iteration: int, metrics: dict[str, float]) -> str:
    """Markdown of one committed iteration: the collapse indicators and validation success first, then every metric
    (throughput included) grouped by namespace, as stored in the ``metrics`` table."""
    metrics = {**metrics, **throughput_metrics(metrics)}
    lines = [f"# Run `{run_id}` · iteration {iteration}", ""]
    headline = [(label, metrics[key]) for key, label in HEADLINE if key in metrics]
    headline += [
        (f"validation success ({key.split('/')[1]})", value)
        for key, value in sorted(metrics.items())
        if key.startswith("val/") and key.endswith("/success")
    ]
    if headline:
        lines += ["| indicator | value |", "|---|---|"]
        lines += [f"| {label} | {_format(value)} |" for label, value in headline]
        lines.append("")
    lines += ["<details><summary>all metrics</summary>", "", "| metric | value |", "|---|---|"]
    lines += [f"| `{name}` | {_format(metrics[name])} |" for name in sorted(metrics)]
    lines += ["", "</details>", ""]
    return "\n".join(lines)


SUMMARY = (
    ("rollout/reward_mean", "reward"),
    ("rollout/success_rate", "success"),
    ("rollout/in_group_reward_std", "grp_std"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/entropy", "entropy"),
    ("actor/grad_norm", "grad"),
    ("rollout/truncated_rate", "trunc"),
)


def iteration_line(iteration: int, metrics: dict[str, float]) -> str:
    """The one-line summary of an iteration: what ``ragen train`` prints after each one and what the run's logs in
    Prefect's UI show (``iter   3 · reward 0.500 · success 0.500 · ... · bandit/success 1.000``)."""
    parts = [f"iter {iteration:>3}"]
    parts += [f"{label} {metrics[key]:.3f}" for key, label in SUMMARY if key in metrics]
    parts += [
        f"{k.removeprefix('val/')} {v:.3f}"
        for k, v in sorted(metrics.items())
        if k.startswith("val/") and k.endswith("/success")
    ]
    return " · ".join(parts)
