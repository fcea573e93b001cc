"""The `ragen` command line: parses, checks, starts the Prefect flows of flows/ and prints; it sits above them."""

import ragen_core  # noqa: F401  (first: it sets the project's OpenMP wait policy before anything loads torch)
