"""Prefect tasks: each a thin typed wrapper around ONE ragen_core call."""
