"""Offline policy-gradient re-training (ragen_core/training/offline.py) refuses an estimator that needs a critic before
it reads any row, naming the registered estimators that need none."""

from __future__ import annotations

import pytest

from ragen_core.algos import ADVANTAGES, needs_critic
from ragen_core.config import build_config
from ragen_core.training.offline import OfflineError, pg_update


@pytest.mark.parametrize("estimator", ["gae", "bi_level_gae"])
def test_offline_pg_refuses_a_critic_estimator_naming_those_without_one(estimator):
    config = build_config(overrides=[f"algorithm.adv_estimator={estimator}"])
    with pytest.raises(OfflineError) as refused:
        pg_update(config, actor=None, table=None, pad_token_id=0, seed=0)  # refused before the rows are read
    free = [name for name in ADVANTAGES.names() if not needs_critic(name)]
    assert str(refused.value) == f"offline pg uses an estimator without a critic ({', '.join(free)}), not {estimator}"
    assert free == ["grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo"]
