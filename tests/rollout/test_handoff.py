"""The shared-memory weight hand-off of a launched group: another process writes a model's weights into the buffer
and this one reads exactly them; a buffer of another model is refused; the file leaves no trace once unlinked."""

import copy
import subprocess
import sys

import pytest
import torch

from ragen_core.rollout.handoff import SharedWeights, WeightLayout

WRITER = """
import sys, torch
from ragen_core.policy import load_policy
from ragen_core.rollout.handoff import SharedWeights, WeightLayout
model, _ = load_policy(sys.argv[1])
shared = SharedWeights.attach(sys.argv[2], WeightLayout.of_module(model))
generator = torch.Generator().manual_seed(7)
with torch.no_grad():
    for parameter in model.parameters():  # new weights, as an update would make
        parameter.copy_(torch.randn(parameter.shape, generator=generator))
shared.write(dict(model.named_parameters()))
"""


@pytest.mark.process  # a writer process
def test_weights_written_by_another_process_arrive_exactly(tmp_path, tiny_model_dir, tiny_policy):
    model, _ = tiny_policy
    layout = WeightLayout.of_module(model)
    assert len({e.name for e in layout.entries}) == len(list(model.parameters()))  # tied weights once
    assert all(e.offset % 64 == 0 for e in layout.entries)
    shared = SharedWeights.create(layout, tmp_path)
    subprocess.run([sys.executable, "-c", WRITER, str(tiny_model_dir), str(shared.path)], check=True)
    rollout = copy.deepcopy(model)
    shared.read_into(rollout)
    generator = torch.Generator().manual_seed(7)  # the writer's values, drawn again here
    for name, parameter in rollout.named_parameters():
        assert torch.equal(parameter, torch.randn(parameter.shape, generator=generator)), name
    assert WeightLayout.from_json(layout.to_json()) == layout
    shared.unlink()
    assert not shared.path.exists()
    shared.read_into(rollout)  # the mapping outlives the name


def test_a_buffer_of_another_model_is_refused(tmp_path, tiny_policy):
    model, _ = tiny_policy
    layout = WeightLayout.of_module(model)
    shared = SharedWeights.create(layout, tmp_path)
    other = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="do not fit the rollout model"):
        shared.read_into(other)
    with pytest.raises(ValueError, match="holds"):
        SharedWeights.attach(shared.path, WeightLayout(layout.entries, layout.nbytes * 2))
    shared.unlink()
    with pytest.raises(OSError, match="no room"):  # the worker then falls back to an export per update
        SharedWeights.create(layout, tmp_path / "missing")
