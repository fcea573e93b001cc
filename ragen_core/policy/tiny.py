"""The tiny offline default policy: a Qwen2-architecture model with random weights and a locally trained tokenizer.

Nothing is downloaded. The tokenizer is a byte-level BPE trained on text rendered from every registered
environment, with Qwen2's own normaliser and pre-tokeniser (transformers loads folders whose config says
``model_type=qwen2`` with ``Qwen2Tokenizer``, which installs those; training with the same ones keeps save -> load
token-identical). The build is reproducible from the config and lands atomically under the data root.

Grid states keep one token per cell: the merges that would join two grid characters (the cell symbols the envs
declare in ``grid_symbols``, and the row break) are dropped from the trained BPE. With them, a row such as
``_GP_`` came out as ``_G``, ``P``, ``_\n`` in one map and ``__``, ``P``, ``G`` in another, so a cell's column had to
be inferred from the widths of the tokens before it. Measured on FrozenLake (``python -m benchmarks.grid_probe``: a
64x2 model trained to predict the value-iteration action from the first prompt, 4000 maps, 300 steps of 64):
agreement with the expert on held-out maps 0.43 with one token per cell vs 0.34 with the merged tokens (the most
frequent action: 0.30).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from ragen_core.agent.prompts import SYSTEM_PROMPT, first_user_message, turn_message
from ragen_core.agent.templates import TINY_CHAT_TEMPLATE
from ragen_core.config import TinyModelConfig
from ragen_core.envs import make_env
from ragen_core.policy.loading import save_policy

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenisation regex (transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX).
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501
TOKENIZER_CORPUS_VERSION = 3  # 3: one token per grid cell
# The environments whose text the tokenizer is trained on, frozen: an environment registered later does not join the
# corpus, so adding one changes no existing model. The corpus itself is pinned by its digest (a test recomputes it):
# changing how one of these renders changes the default model, so it needs a new TOKENIZER_CORPUS_VERSION and digest.
CORPUS_ENVS = (
    "bandit",
    "bandit_reversed",
    "bandit_test",
    "countdown",
    "frozen_lake",
    "game_2048",
    "rubikscube",
    "sokoban",
    "sokoban_large",
    "sokoban_new_vocab",
    "sudoku_pr147_4x4",
    "sudoku_pr147_9x9",
)
CORPUS_DIGEST = "597f61c8148fc9580cd3ec9013e531f838bc411808b65c17581d04a02268e582"  # corpus_digest() of version 3
# Corpus envs renamed since the model key was fixed -> their name then. The corpus renders them as before (the digest
# is unchanged), so the key, and the default model's folder, stay: the two PR #147 Sudokus were ``sudoku`` and
# ``sudoku_9x9`` until RAGEN-2's current Sudoku took the name ``sudoku``.
_KEY_NAMES = {"sudoku_pr147_4x4": "sudoku", "sudoku_pr147_9x9": "sudoku_9x9"}


def tokenizer_corpus(seeds_per_env: int = 40) -> list[str]:
    """Texts the tokenizer is trained on: chat-formatted prompts and replies of the :data:`CORPUS_ENVS`."""
    texts = [SYSTEM_PROMPT, "Reward: 0.1 -0.1 1 10 0 0.5 -1", " ".join(str(n) for n in range(200))]
    for name in CORPUS_ENVS:
        env = make_env(name)
        rng = np.random.default_rng(0)
        for seed in range(seeds_per_env):
            state, _ = env.reset(seed)
            actions = env.action_names
            for enable_think in (True, False):
                user = first_user_message(env.instruction(), actions, 5, turn_message(1, state, 10, enable_think))
                texts.append(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n")
            action = (env.expert_plan(10) or [env.sample_action(rng)])[0] if seed % 2 else env.sample_action(rng)
            texts.append(
                f"<|im_start|>assistant\n<think>I choose {action}.</think><answer>{action}</answer><|im_end|>"
            )
            if actions:
                texts.append(f"<answer>{' || '.join(actions)}</answer>")
            _, reward, _, _, _ = env.step(action)
            texts.append(turn_message(2, env.render(), 9, True, reward=reward))
    return texts


def corpus_digest() -> str:
    """SHA-256 of the tokenizer corpus (its texts joined by a record separator): :data:`CORPUS_DIGEST` unless an
    environment of the corpus renders differently than when the digest was taken."""
    return hashlib.sha256("\x1e".join(tokenizer_corpus()).encode()).hexdigest()


def train_tokenizer(vocab_size: int, one_token_per_cell: bool = True):
    """Train the byte-level BPE tokenizer and wrap it as a transformers fast tokenizer with a ChatML template.
    ``one_token_per_cell=False`` keeps the merges between grid characters (the tokenizer before corpus version 3;
    ``python -m benchmarks.grid_probe`` compares the two)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=without_grid_merges(tokenizer, grid_characters()) if one_token_per_cell else tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    wrapped.chat_template = TINY_CHAT_TEMPLATE
    return wrapped


def grid_characters() -> frozenset[str]:
    """The cell symbols of the corpus's grid envs, and the row break."""
    return frozenset("\n" + "".join(make_env(name).grid_symbols for name in CORPUS_ENVS))


def _byte_level_decoder() -> dict[str, int]:
    """Byte-level BPE's printable stand-in character -> the byte it stands for (GPT-2's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    stand_ins = {b: b for b in printable}
    extra = 0
    for byte in range(256):
        if byte not in stand_ins:
            stand_ins[byte] = 256 + extra
            extra += 1
    return {chr(char): byte for byte, char in stand_ins.items()}


def without_grid_merges(tokenizer, characters: frozenset[str]):
    """``tokenizer`` (a trained byte-level BPE) without the merges that join two of ``characters``, nor those built
    on their results; the remaining vocabulary renumbered in order (the special tokens keep their ids)."""
    from tokenizers import Tokenizer

    state = json.loads(tokenizer.to_str())
    model, decode = state["model"], _byte_level_decoder()

    def grid_only(token: str) -> bool:
        text = bytes(decode[c] for c in token).decode("utf-8", errors="replace")
        return len(text) > 1 and set(text) <= characters

    dropped: set[str] = set()
    merges = []
    for merge in model["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        if left in dropped or right in dropped or grid_only(left + right):
            dropped.add(left + right)
        else:
            merges.append(merge)
    kept = sorted((t for t in model["vocab"] if t not in dropped), key=model["vocab"].get)
    model["vocab"], model["merges"] = {token: i for i, token in enumerate(kept)}, merges
    return Tokenizer.from_str(json.dumps(state))


def tiny_model_key(config: TinyModelConfig) -> str:
    """Folder name of the tiny model built from ``config`` (changes when the shape or the corpus changes, not when an
    environment is added)."""
    payload = json.dumps(
        {
            "config": config.model_dump(mode="json"),
            "corpus": TOKENIZER_CORPUS_VERSION,
            "envs": [_KEY_NAMES.get(name, name) for name in CORPUS_ENVS],
        },
        sort_keys=True,
    )
    return "tiny-" + hashlib.sha256(payload.encode()).hexdigest()[:12]


def build_tiny_model(config: TinyModelConfig, out_dir: Path) -> None:
    """Write the tokenizer and a randomly initialised Qwen2 model (seeded by ``config.seed``) into ``out_dir``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = train_tokenizer(config.vocab_size)
    model_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(config.seed)
        model = Qwen2ForCausalLM(model_config)
    finally:
        torch.random.set_rng_state(generator_state)
    save_policy(model, tokenizer, out_dir)


def ensure_tiny_model(config: TinyModelConfig, models_dir: Path) -> Path:
    """Return the tiny model's folder under ``models_dir``, building it atomically if it is not there yet."""
    target = Path(models_dir) / tiny_model_key(config)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.building-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    build_tiny_model(config, staging)
    try:
        os.rename(staging, target)
    except OSError:  # another process finished the same build first; theirs is identical
        shutil.rmtree(staging, ignore_errors=True)
    return target
