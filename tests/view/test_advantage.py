"""The advantage the viewer shows is the update's, bit for bit: over the real run's lake (the `train` flow), the
viewer's advantages of each iteration's batch (``ragen_core.update``'s inputs and function, the ones the update
calls) average to exactly the ``actor/advantage_mean`` the update logged, and each trajectory's page values are its
row of that batch."""

from __future__ import annotations

import pyarrow.compute as pc

from ragen_core.algos.masked import masked_mean
from ragen_core.config.loading import build_config, stored_config
from ragen_core.storage import DataLake
from ragen_view import queries, tokens
from tests.view.conftest import REAL_RUN


def test_the_advantage_shown_is_the_updates(view_root):
    lake = DataLake(view_root)
    run = queries.run(lake, REAL_RUN)
    config = build_config(stored_config(run["config"]))
    compared = 0
    for iteration in range(config.trainer.iterations):
        metrics = lake.read_table("metrics", REAL_RUN, iteration)
        logged = metrics.filter(pc.equal(metrics["name"], "actor/advantage_mean"))["value"].to_pylist()
        found = tokens.batch_advantages(lake, REAL_RUN, iteration, config)
        if found is None:
            assert logged == [], "the filter kept no group: no update, no advantage logged"
            continue
        inputs, values = found
        assert logged == [float(masked_mean(values, inputs.batch.loss_mask))]  # exactly: the same tensor
        for index, key in enumerate(inputs.keys):
            shown, _ = tokens.advantages(lake, REAL_RUN, iteration, run["config"], run["kind"], key)
            length = int(inputs.batch.attention_mask[index].sum())
            assert shown == values[index, :length].tolist()
        compared += 1
    assert compared, "the premise: the run updated at least once"
