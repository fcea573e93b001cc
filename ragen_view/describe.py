"""What a run is and how it samples, in words, from its kind and stored config: the runs page's cells and a run's
facts (a bootstrap's demonstrations, a training run's schedule)."""

from __future__ import annotations

from typing import Any

# What each kind of run is, in words (the runs page and a run's facts); a kind not named here is shown as it is.
KINDS = {
    "train": "StarPO training",
    "bootstrap": "scripted demonstrations (SFT)",
    "offline": "offline re-training on stored trajectories",
    "evaluation": "a checkpoint evaluated on fixed instances",
}


def what(kind: str | None, config: dict[str, Any], detailed: bool = False) -> str:
    """What a run of ``kind`` is (:data:`KINDS`; empty for another kind); ``detailed``: a bootstrap's
    demonstrations too (:func:`bootstrap_summary`)."""
    said = KINDS.get(kind or "", "")
    if detailed and kind == "bootstrap":
        said += f": {bootstrap_summary(config)}"
    return said


def schedule(kind: str | None, config: dict[str, Any]) -> dict[str, Any] | None:
    """How a training run samples and corrects: ``{"trainer.max_staleness": ..., "algorithm.off_policy_correction":
    ..., "text": ...}`` (each value None when the stored config lacks it; ``text``: both in words). None for a run
    that samples nothing it trains on (a bootstrap, an offline re-training, an evaluation) and for a config that
    holds neither key."""
    if kind != "train":
        return None
    staleness = (config.get("trainer") or {}).get("max_staleness")
    correction = (config.get("algorithm") or {}).get("off_policy_correction")
    if staleness is None and correction is None:
        return None
    words = []
    if staleness is not None:
        words.append("synchronous" if staleness == 0 else f"asynchronous, staleness up to {staleness}")
    if correction is not None:
        words.append("no off-policy correction" if correction == "none" else f"{correction} off-policy correction")
    keys = {"trainer.max_staleness": staleness, "algorithm.off_policy_correction": correction}
    return {**keys, "text": ", ".join(words)}


def bootstrap_summary(config: dict[str, Any]) -> str:
    """What a bootstrap run did, from its stored config: how many scripted demonstrations of which policy on which
    env, and its SFT epochs (the keys its config holds)."""
    settings, env = config.get("bootstrap") or {}, (config.get("env") or {}).get("name")
    groups, size = settings.get("num_groups"), settings.get("group_size")
    said = [f"{groups * size} demonstrations" if groups and size else "demonstrations"]
    if settings.get("policy"):
        said.append(f"of the scripted {settings['policy']} policy")
    if env:
        said.append(f"on {env}")
    if settings.get("epochs"):
        said.append(f"then {settings['epochs']} SFT epoch(s)")
    return " ".join(said)
