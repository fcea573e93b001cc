"""``ragen view``: a read-only web viewer of the trajectory lake (runs, iterations, trajectories), docs/view.md."""
