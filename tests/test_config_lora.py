"""``actor.lora``: out of the config hash at null (every stored run and finding keeps its hash), in it when set; a bad
value, and a setting this increment does not train or read adapters with, refused in one line naming the key; so is
``model.adapter``'s."""

from __future__ import annotations

import pytest

from ragen_core.config import ConfigError, build_config
from ragen_core.config.describe import describe_keys
from ragen_core.config.tree import LATER_KEYS

# RunConfig().config_hash() measured before actor.lora existed (tests/test_config_mcp.py's HASHES_BEFORE)
DEFAULT_HASH_BEFORE = "fc667e9a199578de"


def test_lora_keys_are_later_keys_out_of_the_hash():
    default = build_config()
    assert default.actor.lora is None and LATER_KEYS["actor.lora"] is None
    assert default.to_dict()["actor"]["lora"] is None and "lora" not in default.hashed_tree()["actor"]
    assert default.config_hash() == DEFAULT_HASH_BEFORE
    assert build_config(overrides=["actor.lora=null"]).config_hash() == DEFAULT_HASH_BEFORE
    lora = build_config(overrides=["actor.lora.rank=8"])
    assert lora.to_dict()["actor"]["lora"] == {"rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
    assert lora.config_hash() != DEFAULT_HASH_BEFORE
    assert build_config(overrides=["actor.lora.rank=16"]).config_hash() != lora.config_hash()
    keys = {key.key: key for key in describe_keys(lora)}
    assert keys["actor.lora.rank"].value == 8 and keys["actor.lora.target_modules"].description


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["actor.lora={}"], "actor.lora.rank: required"),
        (["actor.lora.rank=0"], "actor.lora.rank: Input should be greater than 0"),
        (["actor.lora.rank=513"], "actor.lora.rank: Input should be less than or equal to 512"),
        (["actor.lora.rank=4", "actor.lora.dropout=1"], "actor.lora.dropout: Input should be less than 1"),
        (["actor.lora.rank=4", "actor.lora.alpha=0"], "actor.lora.alpha: Input should be greater than 0"),
        (["actor.lora.rank=4", "actor.lora.target_modules=[lm_head]"], "actor.lora.target_modules: 'lm_head' is no"),
        (
            ["actor.lora.rank=4", "actor.lora.target_modules=[q_proj, model.embed_tokens]"],
            "actor.lora.target_modules: 'model.embed_tokens' is no layer an adapter may go on",
        ),
        (["actor.lora.rank=4", "actor.lora.target_modules=[]"], "actor.lora.target_modules: an empty list"),
        (["actor.lora.rank=4", "actor.lora.target_modules=all"], "'all' is neither 'all-linear' nor a list"),
        (["actor.lora.rank=4", "actor.lora.r=4"], "actor.lora.r: unknown key"),
    ],
)
def test_a_wrong_or_unsupported_lora_setting_is_refused_in_one_line(overrides, said):
    with pytest.raises(ConfigError) as caught:
        build_config(overrides=overrides)
    message = str(caught.value)
    assert said in message
    assert len(message.strip().splitlines()) == 2  # "invalid config:" and the one line naming the key


def test_model_adapter_is_a_later_key_out_of_the_hash():
    assert LATER_KEYS["model.adapter"] is None and build_config().model.adapter is None
    assert "adapter" not in build_config().hashed_tree()["model"]
    assert build_config(overrides=["model.adapter=null"]).config_hash() == DEFAULT_HASH_BEFORE
    assert build_config(overrides=["model.adapter=/adapters/a"]).config_hash() != DEFAULT_HASH_BEFORE


def test_target_modules_take_layer_names():
    config = build_config(overrides=["actor.lora.rank=4", "actor.lora.target_modules=[q_proj, v_proj]"])
    assert config.actor.lora.target_modules == ["q_proj", "v_proj"]
