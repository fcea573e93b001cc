import torch

from ragen_core.config import TinyModelConfig
from ragen_core.policy import load_tokenizer
from ragen_core.policy.tiny import build_tiny_model, train_tokenizer


def test_tokenizer_round_trips_through_save_and_autotokenizer(tiny_model_dir):
    trained = train_tokenizer(TinyModelConfig().vocab_size)
    loaded = load_tokenizer(tiny_model_dir)
    text = (
        "<|im_start|>user\nTurn 1:\nState:\nTwo arms stand before you: Dragon and Phoenix.<|im_end|>\n"
        "<|im_start|>assistant\n<think>I will take Dragon.</think><answer>Dragon</answer><|im_end|> 123 √ é"
    )
    assert trained.encode(text, add_special_tokens=False) == loaded.encode(text, add_special_tokens=False)
    assert loaded.decode(loaded.encode(text, add_special_tokens=False)) == text
    assert loaded.eos_token == "<|im_end|>" and loaded.chat_template


def test_build_is_reproducible_from_the_seed(tmp_path, tiny_policy):
    from transformers import AutoModelForCausalLM

    build_tiny_model(TinyModelConfig(), tmp_path / "again")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "again")
    model, _ = tiny_policy
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=False):
        assert torch.equal(a, b), name


def test_grid_states_are_one_token_per_cell_and_other_text_still_merges(tiny_model_dir):
    from ragen_core.envs import make_env

    loaded = load_tokenizer(tiny_model_dir)
    for name, cells in (("frozen_lake", "P_OGX\u221a"), ("sokoban", "#_OX\u221aPS"), ("sokoban_new_vocab", "W.GBCA@")):
        env = make_env(name)
        for seed in range(30):
            state = env.reset(seed)[0]
            pieces = [loaded.decode([i]) for i in loaded.encode(state, add_special_tokens=False)]
            assert pieces == list(state), (name, seed, pieces)  # one token per character: per cell and row break
            assert set(state) <= set(cells + "\n")
    # the merges that do not join two grid characters are kept: an instruction word is not spelled out
    assert len(loaded.encode("You are a helpful assistant", add_special_tokens=False)) <= 6


def test_the_tokenizer_corpus_is_pinned_by_its_digest():
    """The default model's tokenizer is trained on this corpus: an environment that renders differently changes every
    default model, so it must come with a new TOKENIZER_CORPUS_VERSION and CORPUS_DIGEST (which change the key)."""
    import hashlib

    from ragen_core.policy.tiny import CORPUS_DIGEST, tokenizer_corpus

    texts = tokenizer_corpus()
    assert hashlib.sha256("\x1e".join(texts).encode()).hexdigest() == CORPUS_DIGEST, (
        "the tokenizer corpus changed: bump TOKENIZER_CORPUS_VERSION and set CORPUS_DIGEST to the new digest "
        "(this changes the default tiny model, and the numbers measured with it)"
    )


def test_a_new_environment_changes_no_existing_model():
    from ragen_core.config import TinyModelConfig
    from ragen_core.envs import base, make_env, register_env, registered_envs
    from ragen_core.policy.tiny import grid_characters, tiny_model_key

    before, grid_before = tiny_model_key(TinyModelConfig()), grid_characters()
    register_env("zz_new_grid_env")(base._REGISTRY.get("sokoban"))
    try:
        assert "zz_new_grid_env" in registered_envs() and make_env("zz_new_grid_env") is not None
        assert tiny_model_key(TinyModelConfig()) == before and grid_characters() == grid_before
    finally:
        base._REGISTRY.remove("zz_new_grid_env")
    assert tiny_model_key(TinyModelConfig(num_heads=4, num_kv_heads=2)) != before  # the shape still counts


def test_saved_models_follow_the_umask(tmp_path):
    """transformers writes the weights through a 0600 temporary file; a saved policy's files are as the umask says."""
    import os

    from ragen_core.config import TinyModelConfig
    from ragen_core.policy import ensure_tiny_model

    previous = os.umask(0o022)
    try:
        folder = ensure_tiny_model(TinyModelConfig(), tmp_path / "models")
    finally:
        os.umask(previous)
    modes = {path.name: path.stat().st_mode & 0o777 for path in folder.iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes


def test_renaming_a_corpus_env_keeps_the_default_models_folder():
    """The PR #147 Sudokus were renamed (``sudoku`` -> ``sudoku_pr147_4x4``, ``sudoku_9x9`` -> ``sudoku_pr147_9x9``)
    when RAGEN-2's current Sudoku took the name ``sudoku``; their text, the corpus and the model did not change, so
    neither does the folder key (the value before the rename)."""
    from ragen_core.config import TinyModelConfig
    from ragen_core.policy.tiny import CORPUS_ENVS, tiny_model_key

    assert {"sudoku_pr147_4x4", "sudoku_pr147_9x9"} <= set(CORPUS_ENVS) and "sudoku" not in CORPUS_ENVS
    assert tiny_model_key(TinyModelConfig()) == "tiny-ad4efc149cc4"
