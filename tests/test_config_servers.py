"""``rollout.vllm.servers``, ``shards`` and ``on_server_loss``: where rollouts are sampled is placement (out of the
config hash, free on resume, another host's URL used from a stored config only when named again); how each turn is
split is in the hash once it differs from one part; each mistake is one line naming the key."""

from __future__ import annotations

import pytest

from ragen_core.config import ConfigError, RunConfig, build_config
from ragen_core.config.trust import StoredConfig, UntrustedConfigError, check_stored_trust, trusted_keys
from ragen_core.run.decisions import config_changes
from tests.test_config_remote import HASHES_BEFORE


def test_the_defaults_leave_every_hash_as_it_was_and_the_servers_never_enter_it():
    config = RunConfig()
    assert config.rollout.vllm.servers == ["local"] and config.rollout.vllm.shards == 1
    assert config.config_hash() == HASHES_BEFORE[None]
    three = ["rollout.vllm.servers=[local,http://10.0.0.7:8000,http://10.0.0.8:8000]", "rollout.vllm.shards=3"]
    assert build_config(None, three).config_hash() == build_config(None, ["rollout.vllm.shards=3"]).config_hash()
    lost = build_config(None, ["rollout.vllm.on_server_loss=continue"])
    assert lost.config_hash() == HASHES_BEFORE[None]
    assert build_config(None, ["rollout.vllm.shards=2"]).config_hash() != HASHES_BEFORE[None]  # rows depend on it


def test_a_resume_may_name_other_servers_but_not_other_shards():
    before = build_config(None, ["rollout.vllm.servers=[local,http://10.0.0.7:8000]", "rollout.vllm.shards=2"])
    after = build_config(None, ["rollout.vllm.servers=[http://10.0.0.9:8000]", "rollout.vllm.shards=2"])
    assert config_changes(before.to_dict(), after.to_dict()) == []
    other = build_config(None, ["rollout.vllm.shards=3"])
    assert config_changes(before.to_dict(), other.to_dict()) == ["rollout.vllm.shards"]


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["rollout.vllm.servers=[local,local]"], "rollout.vllm.shards=1 keeps at most 1 of the 2 servers busy"),
        (["rollout.vllm.servers=[]"], "rollout.vllm.servers"),
        (["rollout.vllm.servers=[http://127.0.0.1:8000/v1]"], "a path: write http://HOST:PORT"),
        (["rollout.vllm.servers=[node2:8000]"], "a scheme other than http or https"),
        (["rollout.vllm.servers=[http://a:1,http://a:1]", "rollout.vllm.shards=2"], "names a server twice"),
        (["rollout.vllm.shards=0"], "rollout.vllm.shards"),
        (["rollout.vllm.on_server_loss=retry"], "rollout.vllm.on_server_loss"),
    ],
)
def test_each_mistake_is_one_line_naming_the_key(overrides, said):
    with pytest.raises(ConfigError) as caught:
        build_config(None, overrides)
    assert said in str(caught.value), str(caught.value)


def test_a_url_is_kept_without_its_trailing_slash_and_local_as_written():
    config = build_config(None, ["rollout.vllm.servers=[local,http://127.0.0.1:8000/]", "rollout.vllm.shards=4"])
    assert config.rollout.vllm.servers == ["local", "http://127.0.0.1:8000"]


def test_a_stored_config_sends_the_token_to_no_other_host_unless_named_again(tmp_path):
    declared = {key.key: key.kind for key in trusted_keys(RunConfig)}
    assert declared["rollout.vllm.servers"] == "servers"
    config = build_config(None, ["rollout.vllm.servers=[local,http://10.0.0.7:8000]", "rollout.vllm.shards=2"])
    stored = StoredConfig(config.to_dict(), "runs/r/manifest.json", tmp_path)
    with pytest.raises(UntrustedConfigError) as caught:
        check_stored_trust(config, stored, set())
    assert "sets rollout.vllm.servers=['local', 'http://10.0.0.7:8000']" in str(caught.value)
    assert "does not name rollout servers other than the run's own to send its token to" in str(caught.value)
    assert 'pass \'rollout.vllm.servers=["local","http://10.0.0.7:8000"]\' again' in str(caught.value)
    check_stored_trust(config, stored, {"rollout.vllm.servers"})  # named again
    here = build_config(None, ["rollout.vllm.servers=[local,http://127.0.0.1:8000]", "rollout.vllm.shards=2"])
    with pytest.raises(UntrustedConfigError):  # a loopback port may be another user's of this machine
        check_stored_trust(here, StoredConfig(here.to_dict(), "m", tmp_path), set())
    both = build_config(None, ["rollout.vllm.servers=[local,local]", "rollout.vllm.shards=2"])
    check_stored_trust(both, StoredConfig(both.to_dict(), "m", tmp_path), set())  # servers the run starts itself
    default = build_config(RunConfig().to_dict())  # as read back from a stored file: the run's own server
    check_stored_trust(default, StoredConfig(RunConfig().to_dict(), "m", tmp_path), set())
