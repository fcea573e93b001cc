"""Prefect flows: each reads as the list of its stages."""
