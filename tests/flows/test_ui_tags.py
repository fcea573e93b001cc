"""A run's Prefect tags spell the config's own values: a tag's value given back as an override is the same setting
(the issue: tags said ``preset:starpo-s`` where the config says ``starpo_s``)."""

from __future__ import annotations

import pytest

from flows.ui import run_tags
from ragen_core.config import PRESET_NAMES, build_config


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_a_tags_value_is_the_configs_spelling(preset):
    config = build_config(overrides=[f"algorithm.preset={preset}", "env.name=sokoban"])
    tags = dict(tag.split(":", 1) for tag in run_tags(config.env.name, config.algorithm.preset, "sweep-1"))
    assert tags == {"env": "sokoban", "preset": preset, "sweep": "sweep-1"}
    again = build_config(overrides=[f"algorithm.preset={tags['preset']}", f"env.name={tags['env']}"])
    assert again.algorithm.preset == config.algorithm.preset and again.env.name == config.env.name
