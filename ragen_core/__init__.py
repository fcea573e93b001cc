"""RAGEN-Flows core library: environments, agent, policy, rollouts, algorithms, training, storage."""
