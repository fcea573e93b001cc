"""Resume's config comparison: keys added to the config after a run started count as unchanged at their default."""

from __future__ import annotations

import copy

from ragen_core.config import build_config
from ragen_core.resume import config_changes


def test_a_key_the_old_run_lacks_is_unchanged_at_its_default_and_changed_otherwise():
    new = build_config({}).to_dict()
    old = copy.deepcopy(new)
    del old["monitor"]["tensorboard"]  # a run from before the key existed
    assert config_changes(old, new) == []
    off = build_config({}, ["monitor.tensorboard=false"]).to_dict()
    assert config_changes(old, off) == ["monitor.tensorboard"]
    assert config_changes(new, off) == ["monitor.tensorboard"]
    assert config_changes(new, build_config({}, ["trainer.iterations=3"]).to_dict()) == ["trainer.iterations"]
    # a key the new config dropped is always a change
    extra = copy.deepcopy(new)
    extra["monitor"]["retired_key"] = 1
    assert config_changes(extra, new) == ["monitor.retired_key"]


def test_a_run_stored_before_the_think_prefix_resumes_without_it():
    """rollout.think_prefix came later with default true; a stored config without it behaved as false, so reading it
    back fills false, an unchanged resume sees no change, and a config that turns it on is a change."""
    from ragen_core.config import build_config, stored_config
    from ragen_core.resume import config_changes

    old = build_config().to_dict()
    del old["rollout"]["think_prefix"]
    restored = build_config(stored_config(old))
    assert restored.rollout.think_prefix is False
    assert config_changes(old, restored.to_dict()) == []
    assert config_changes(old, build_config().to_dict()) == ["rollout.think_prefix"]
    assert "think_prefix" not in old["rollout"]  # the stored tree itself is not modified
