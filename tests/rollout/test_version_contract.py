"""The policy-version contract at the backend's edge (:func:`ragen_core.rollout.sampling.check_version`): a sampler
that counts versions is held to the schedule's; one that counts none (a scripted policy, a user's own backend without
``version``, like the bench's synthetic replies) is not checked."""

from __future__ import annotations

import pytest

from ragen_core.rollout.sampling import PolicyVersionError, check_version


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
