"""The `ragen` command line: parses, checks, starts the Prefect flows of flows/ and prints; it sits above them."""
