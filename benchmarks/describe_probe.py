"""Can the tiny model learn to DESCRIBE a FrozenLake map, i.e. write where the goal lies relative to the player?

The idea this probes (the tiny-scale analogue of a pretrained model that reads text grids): a bootstrap whose replies
keep random actions but whose ``<think>`` describes the state ("The goal is down and right."), so that RL only has
to learn to act on the model's own description. That is worth trying only if supervised learning teaches the
description within a bootstrap's budget. Supervised, no RL: a tiny Qwen2 shape (random init, seed 0) is trained on
the description after ``<think>`` in the real first prompt of a FrozenLake episode (teacher forcing), on ``--maps``
training maps (seeds 100000..), and scored on ``--held-out`` maps (seeds 0..) by exact match: every token of the
description is the model's top choice. ``--prompt`` picks the prompt: ``full`` (the real one),
``no-legend`` (the real one without the sentence that lists the symbols, which holds a second ``P`` and ``G``),
``compact`` (a one-line rule, the actions and the turn text: what a short prompt for this task could be) or ``grid``
(the state grid alone), to tell reading the grid from finding it in a long prompt. Run:
``python -m benchmarks.describe_probe [--hidden 64] [--layers 2] [--steps 600] [--prompt full]``.

Measured (64x2, one thread; docs/findings.md, "Multi-turn learning"): the real prompt stays at the level of one fixed
description for about 1,000 steps and reaches 0.57 at 1,500 (26 minutes); ``compact`` 0.83 and ``grid`` 0.89 at 1,000
steps (4 and 2.5 minutes).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch

from ragen_core.agent.prompts import SYSTEM_PROMPT, first_user_message, turn_message
from ragen_core.envs import make_env
from ragen_core.policy.tiny import train_tokenizer

PROMPTS = ("full", "no-legend", "compact", "grid")


def described_prompts(
    tokenizer, seeds: range, prompt_kind: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
    """(left-padded ids, attention mask, targets with -100 outside the description, the descriptions) of the first
    turn of each seed's map, the prompt ending in ``<think>`` and followed by the description and ``</think>``."""
    env = make_env("frozen_lake")
    pairs, descriptions = [], []
    for seed in seeds:
        state, _ = env.reset(seed)
        if prompt_kind == "grid":
            prompt = f"<|im_start|>user\n{state}<|im_end|>\n<|im_start|>assistant\n<think>"
        elif prompt_kind == "compact":
            turn = turn_message(1, state, 10, True, style="compact")  # the compact prompt style's first message
            user = first_user_message(env.brief(), env.action_names, 1, turn, style="compact")
            prompt = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>"
        else:
            instruction = env.instruction()
            if prompt_kind == "no-legend":
                instruction = instruction.split("\nThe symbols of the state are:")[0]
            user = first_user_message(instruction, env.action_names, 1, turn_message(1, state, 10, True))
            prompt = (
                f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                "<|im_start|>assistant\n<think>"
            )
        descriptions.append(env.describe())
        pairs.append(
            (
                tokenizer.encode(prompt, add_special_tokens=False),
                tokenizer.encode(descriptions[-1] + "</think>", add_special_tokens=False),
            )
        )
    width = max(len(p) + len(d) for p, d in pairs)
    ids = torch.full((len(pairs), width), tokenizer.pad_token_id)
    mask, targets = torch.zeros_like(ids), torch.full_like(ids, -100)
    for row, (prompt, description) in enumerate(pairs):
        start = width - len(prompt) - len(description)
        ids[row, start:], mask[row, start:] = torch.tensor(prompt + description), 1
        targets[row, start + len(prompt) - 1 : width - 1] = torch.tensor(description)  # position t predicts t + 1
    return ids, mask, targets, descriptions


def probe(args: argparse.Namespace) -> list[tuple[int, float, float]]:
    """(step, held-out exact match, held-out token accuracy) every ``--eval-every`` steps of batches of 64."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = train_tokenizer(1024)
    train = described_prompts(tokenizer, range(100_000, 100_000 + args.maps), args.prompt)
    held_out = described_prompts(tokenizer, range(args.held_out), args.prompt)
    frequent = Counter(held_out[3]).most_common(1)[0][1] / len(held_out[3])
    print(f"most frequent description on the held-out maps: {frequent:.3f}")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    def logits(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits

    generator, curve, started = torch.Generator().manual_seed(0), [], time.perf_counter()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0:
            with torch.no_grad():
                scored = held_out[2] != -100
                right = logits(*held_out[:2]).argmax(-1) == held_out[2]
            exact = (right | ~scored).all(-1).float().mean().item()
            curve.append((step, exact, (right & scored).sum().item() / scored.sum().item()))
            print(
                f"  step {step:5d}: exact {curve[-1][1]:.3f}, tokens {curve[-1][2]:.3f}, "
                f"{time.perf_counter() - started:.0f} s",
                flush=True,
            )
        if step == args.steps:
            break
        batch = torch.randint(len(train[2]), (64,), generator=generator)
        out = logits(train[0][batch], train[1][batch])
        loss = torch.nn.functional.cross_entropy(out.flatten(0, 1), train[2][batch].flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return curve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=64, help="hidden size (4 heads; MLP 4x)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--maps", type=int, default=4000, help="training maps")
    parser.add_argument("--held-out", type=int, default=500, help="held-out maps")
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps of 64 examples")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--prompt", choices=PROMPTS, default="full", help="how much text surrounds the grid")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    for name in ("hidden", "layers", "maps", "held_out", "eval_every", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.hidden % 4 or args.steps < 0 or args.lr <= 0:
        parser.error("--hidden must be a multiple of 4 (4 heads), --steps at least 0 and --lr positive")
    torch.set_num_threads(args.threads)
    curve = probe(args)
    print(f"best exact match {max(exact for _, exact, _ in curve):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
