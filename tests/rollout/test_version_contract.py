"""The policy-version contract at the backend's edge (:func:`ragen_core.rollout.sampling.check_version`): a sampler
that counts versions is held to the schedule's; one that counts none (a scripted policy, a user's own backend without
``version``, like the bench's synthetic replies) is not checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragen_core.rollout.sampling import PolicyVersionError, SamplerBackend, check_version


class _Counted:
    def __init__(self, version):
        self.version = version


class _OwnBackend:  # a backend of a user's own: generate/reset only
    def generate(self, contexts, seed):
        return []


def test_a_counted_sampler_must_hold_the_version_the_schedule_names():
    check_version(_Counted(3), 3, "iteration 3's training batch")
    with pytest.raises(PolicyVersionError, match=r"after 3 updates, but its sampler holds the weights after 2"):
        check_version(_Counted(2), 3, "iteration 3's training batch")


@pytest.mark.parametrize("backend", [_Counted(None), _OwnBackend()], ids=["version None", "no version attribute"])
def test_a_sampler_that_counts_no_versions_is_not_checked(backend):
    assert check_version(backend, 5, "iteration 5's training batch") is None


class _Loads:
    """A sampler of the session that records what it is handed (a test's own, through the Sampler interface)."""

    behavior_source = "policy"

    def __init__(self):
        self.loaded, self.version = [], 0

    def load(self, weights):
        self.loaded.append(weights.version)
        self.version = weights.version


def test_a_relabel_moves_the_version_on_without_reloading_a_server_s_weights():
    from ragen_core.rollout.policy import RolloutPolicy
    from ragen_core.rollout.samplers import VLLMSampler

    server = VLLMSampler(server=None, tokenizer=None)  # a reload would reach the (absent) server and fail
    policy = RolloutPolicy(Path("start"), None, None, "model", server)
    policy.relabel(1)
    assert server.version == 1 and policy.current.version == 1 and policy.current.module == "model"
    assert policy.current.export() == Path("start")  # the same weights: the start model's, as before
    check_version(SamplerBackend(server, None), 1, "iteration 1's training batch")

    plain = _Loads()  # a sampler without relabel takes the same weights again under the new version
    policy = RolloutPolicy(Path("start"), None, None, "model", plain)
    policy.relabel(3)
    assert plain.loaded == [3] and plain.version == 3
