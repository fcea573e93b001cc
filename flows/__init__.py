"""Prefect flows: each reads as the list of its stages."""

import ragen_core  # noqa: F401  (first: it sets the project's OpenMP wait policy before anything loads torch)
