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
