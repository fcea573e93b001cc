"""The lake benchmark's synthetic batches are real rows of the current schemas (a column added to a table must be
added to them too, or `make bench` breaks at its lake section)."""

import numpy as np

from benchmarks.lake_synth import BatchShape, make_batch
from schemas.tables import TRAJECTORIES, TURNS


def test_a_synthetic_batch_has_the_current_schemas_and_consistent_rows():
    shape = BatchShape(train_groups=4, group_size=2, val_groups=2, val_k=1, turns=3)
    grids = np.array(["#####\n#_P_#\n#####"], dtype=object)
    trajectories, turns = make_batch(np.random.default_rng(0), "synthetic", 2, shape, grids)
    assert trajectories.schema.equals(TRAJECTORIES.arrow_schema, check_metadata=False)
    assert turns.schema.equals(TURNS.arrow_schema, check_metadata=False)
    assert trajectories.num_rows == 4 * 2 + 2 * 1 and turns.num_rows == trajectories.num_rows * 3
    train = trajectories.filter(trajectories["split"].to_numpy(zero_copy_only=False) == "train")
    assert train["kept"].null_count == 0 and train["filter_metric_value"].null_count == 0
    assert trajectories["segment_lengths"].null_count == trajectories.num_rows  # full context: one sequence per row
