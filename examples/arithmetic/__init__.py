"""Arithmetic prompts with a verifiable reward: a prompt file generator (``make_prompts``) and the reward function
(``reward.score``), the dataset env's worked example (configs/dataset_arithmetic.yaml)."""
