"""Can the tiny model read a FrozenLake map? The tokenizer with one token per grid cell against the merged one.

Supervised, no RL: the tiny Qwen2 shape (random init, seed 0) learns to predict the expert's first action (value
iteration, ``env.expert_plan``) from the real first prompt of a FrozenLake episode, on ``--maps`` training maps (seeds
100000..), and is scored on 500 held-out maps (seeds 0..499) by its agreement with the expert every 100 steps. Both
tokenizers are trained from the same corpus; only the merges between grid characters differ. Run:
``python -m benchmarks.grid_probe [--maps 4000] [--steps 600] [--threads 1]`` (about 5 minutes per tokenizer on one
core).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from ragen_core.agent.prompts import SYSTEM_PROMPT, first_user_message, turn_message
from ragen_core.envs import make_env
from ragen_core.policy.tiny import train_tokenizer


def first_prompts(tokenizer, seeds: range) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(left-padded ids, attention mask, expert action index) of the first turn of each seed's map."""
    env = make_env("frozen_lake")
    texts, labels = [], []
    for seed in seeds:
        state, _ = env.reset(seed)
        user = first_user_message(env.instruction(), env.action_names, 1, turn_message(1, state, 10, False))
        texts.append(
            f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n<answer>"
        )
        labels.append(env.action_names.index(env.expert_plan(10)[0]))
    encoded = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    width = max(map(len, encoded))
    ids = torch.full((len(encoded), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, tokens in enumerate(encoded):
        ids[row, width - len(tokens) :], mask[row, width - len(tokens) :] = torch.tensor(tokens), 1
    return ids, mask, torch.tensor(labels)


def probe(one_token_per_cell: bool, maps: int, steps: int, lr: float) -> list[tuple[int, float]]:
    """(step, held-out agreement with the expert) every 100 steps of batches of 64."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = train_tokenizer(1024, one_token_per_cell)
    actions = torch.tensor(
        [tokenizer.encode(a, add_special_tokens=False)[0] for a in make_env("frozen_lake").action_names]
    )
    train, held_out = first_prompts(tokenizer, range(100_000, 100_000 + maps)), first_prompts(tokenizer, range(500))
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)

    def scores(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits[:, -1]
        return logits[:, actions]

    generator, curve = torch.Generator().manual_seed(0), []
    for step in range(steps + 1):
        if step % 100 == 0:
            with torch.no_grad():
                agreement = (scores(*held_out[:2]).argmax(-1) == held_out[2]).float().mean().item()
            curve.append((step, agreement))
            print(f"  step {step:4d}: held-out agreement {agreement:.3f}", flush=True)
        batch = torch.randint(len(train[2]), (64,), generator=generator)
        loss = torch.nn.functional.cross_entropy(scores(train[0][batch], train[1][batch]), train[2][batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--maps", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    labels = first_prompts(train_tokenizer(1024), range(500))[2].numpy()
    print(f"most frequent expert action on the held-out maps: {np.bincount(labels).max() / len(labels):.3f}")
    for cells in (True, False):
        started = time.perf_counter()
        print(f"tokenizer with {'one token per cell' if cells else 'merged grid tokens'}:", flush=True)
        curve = probe(cells, args.maps, args.steps, args.lr)
        best = max(a for _, a in curve)
        print(f"  best {best:.3f}, {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
