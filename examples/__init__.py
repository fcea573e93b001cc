"""Worked examples of bringing your own code to RAGEN-Flows (docs/usage.md, "Your own environment")."""
