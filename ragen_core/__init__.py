"""RAGEN-Flows core library: environments, agent, policy, rollouts, algorithms, training, storage."""

import os

# OpenMP threads that wait for work spin by default; on a machine shared with other jobs a process's spinning threads
# take the cores the others need, its own included (measured at load 14-25: an SFT epoch of the demo's bootstrap took
# 144-270 s, and 12-21 s with passive waiting, the same losses). Passive waiting costs a machine of one's own little.
# Set before torch loads its OpenMP runtime (which reads the variable once, when it loads): every command, flow and
# worker of the project imports this package first, and the processes they start inherit it. A user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
