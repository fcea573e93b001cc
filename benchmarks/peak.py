"""The machine's measured matmul peak, and the update's achieved FLOP/s as a share of it (``update_peak_share``).

On a GPU the model FLOPs utilisation (MFU) divides by the data sheet's peak; a CPU has no such figure that a shared,
loaded machine would reach, so the denominator is measured in the same run: the best FLOP/s of a bare ``torch.mm``
(square fp32 matrices on CPU, bf16 on CUDA) with the threads the update uses. The update's FLOPs are the model
FLOPs of its training passes, 6 x parameters x tokens per pass over the batch (forward 2, backward 4; attention's
own FLOPs left out, as in MFU), plus 2 x parameters x tokens when it re-scores the batch, over the tokens the rows
hold (padding is waste, not work).
"""

from __future__ import annotations

from typing import Any


def update_flops(parameters: int, tokens: int, passes: int = 1, rescored: bool = False) -> float:
    """Model FLOPs of an update: ``passes`` forward+backward passes over ``tokens`` tokens (6 N each), and one more
    forward (2 N) when the old log-probs are re-scored."""
    return (6.0 * passes + (2.0 if rescored else 0.0)) * parameters * tokens


def update_peak_share(case: dict[str, Any], peak_tflops: float) -> dict[str, float]:
    """The share of the matmul peak the update achieved: an update-bench case (its median time of ours, which
    takes the stored log-probs and trains one pass over the batch's ``processed_tokens``)."""
    seconds = sorted(case["ours_seconds"])[len(case["ours_seconds"]) // 2]
    achieved = update_flops(case["parameters"], case["processed_tokens"]) / seconds / 1e12
    return {"achieved_tflops": achieved, "peak_tflops": peak_tflops, "share": achieved / peak_tflops}
