"""The ``algorithm`` section of a group filter, built from the filter's keys alone (for the filter tests)."""

from ragen_core.config import AlgorithmConfig


def filter_section(
    strategy: str = "top_k",
    value: float = 1.0,
    metric: str = "reward_std",
    largest: bool | None = None,
    include_zero: bool = True,
    top_p_mode: str = "linear",
    eps: float = 0.01,
) -> AlgorithmConfig:
    """``algorithm.filter=strategy``, ``filter_ratio=value`` and the other ``filter_*`` keys (``largest`` None: the
    strategy's own direction, largest unless the alias std_rev)."""
    return AlgorithmConfig(
        filter=strategy,
        filter_ratio=value,
        filter_metric=metric,
        filter_largest=largest,
        filter_include_zero=include_zero,
        filter_top_p_mode=top_p_mode,
        filter_eps=eps,
    )
