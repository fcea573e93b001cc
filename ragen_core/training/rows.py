"""Stored token rows as tensors live in :mod:`ragen_core.update.rows`, below training (the viewer reads the update's
rows without training); this name stays for the modules that still import them from here (the run layer's filter
stage), until they import them from there."""

from ragen_core.update.rows import FULL_CONTEXT, TokenRows, policy_sampled

__all__ = ["FULL_CONTEXT", "TokenRows", "policy_sampled"]
