"""A LoRA run in every schedule and place its updates run: in process, in a launched group (torchrun, 2 ranks, ZeRO-2
and ZeRO-3) and async (trainer.max_staleness=1, the sampler process). The rollout side takes the adapters only, and
every training row was sampled by the adapters of the policy version the row names: its stored behaviour log-probs
are recomputed with PEFT's own loader on the checkpoint of that version (version 0: the start model, whose fresh
adapters add exactly zero), and the base model's differ.

The launched ZeRO-2 run is killed inside an update and resumed (the restore hands the checkpoint's adapters to the
rollout copy through their export, an adapter folder); with 2 ranks and micro_batch_size = mini_batch_size / 2 its
weights, and so its rows, are bitwise the in-process run's (tests/flows/test_launcher.py says why)."""

import signal

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.storage import DataLake
from tests.flows.test_launcher import LAUNCHED, RUN, _overrides, _ragen, _rows
from tests.flows.test_lora_policy import _gap, _peft_model

pytestmark = pytest.mark.slow  # five CLI runs, three of them starting a 2-process group (2-3 minutes)
LORA = [
    "actor.lora.rank=4",
    "actor.lora.alpha=32",
    "actor.lr=0.02",
    "trainer.checkpoint_every=1",
    "trainer.keep_last=9",
]
PLACES = {
    "zero3": ["trainer.launcher=torchrun", "trainer.nproc=2", "actor.zero_stage=3"],
    "async": ["trainer.max_staleness=1"],
}


@pytest.fixture(scope="module")
def train(tiny_model_dir, tiny_policy, prefect_server):
    """The run's command line and the Prefect API; each place's run is a fixture of its own (a test waits for the
    runs it reads, not for all five commands)."""
    from ragen_core.training import ActorEngine, OptimConfig

    # DeepSpeed compiles a CPU op at its first engine: build it here, never inside a process that gets killed
    ActorEngine(tiny_policy[0], OptimConfig(lr=1e-3, weight_decay=0.0, grad_clip=1.0, micro_batch_size=1))
    overrides = [o for o in _overrides(tiny_model_dir) if not o.startswith("trainer.checkpoint_every=")]
    return ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *overrides, *LORA], prefect_server[0].api_url


def _place(train, tmp_path_factory, name):
    command, api_url = train
    root = tmp_path_factory.mktemp(name)
    rc, output, _ = _ragen([*command, *PLACES.get(name, [])], root, api_url)
    assert rc == 0, f"{name}: {output[-3000:]}"
    return root


@pytest.fixture(scope="module")
def inprocess(train, tmp_path_factory):
    return _place(train, tmp_path_factory, "inprocess")


@pytest.fixture(scope="module")
def zero3(train, tmp_path_factory):
    return _place(train, tmp_path_factory, "zero3")


@pytest.fixture(scope="module", name="async")
def async_run(train, tmp_path_factory):
    return _place(train, tmp_path_factory, "async")


@pytest.fixture(scope="module")
def launched(train, tmp_path_factory):
    """The launched ZeRO-2 run, killed inside its fourth update and resumed."""
    command, api_url = train
    root = tmp_path_factory.mktemp("launched")
    rc, output, survivors = _ragen([*command, *LAUNCHED], root, api_url, fault="update:inside@3")
    assert rc == -signal.SIGKILL and not survivors, output[-3000:]
    rc, output, _ = _ragen(["resume", RUN, "trainer.launcher=torchrun"], root, api_url)
    assert rc == 0 and "resumed at iteration" in output, output[-3000:]
    return root


def _adapters(root) -> dict[str, torch.Tensor]:
    return load_file(DataLake(root).checkpoint_dir(RUN, 4) / "adapter" / "adapter_model.safetensors")


@pytest.mark.usefixtures("train")  # the run of each place, through request (marked as using the session server)
@pytest.mark.parametrize("place", ["inprocess", "launched", *PLACES])
def test_every_training_row_was_sampled_by_the_adapters_of_its_policy_version(request, place, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    lake = DataLake(request.getfixturevalue(place))
    config = lake.read_manifest(RUN).config
    temperature = config["rollout"]["temperature"]
    rows = [row for row in lake.read_table("trajectories", RUN).to_pylist() if row["split"] == "train"]
    versions = sorted({row["policy_version"] for row in rows})
    lag = {row["iteration"] - row["policy_version"] for row in rows}
    # iterations 0-3: in sync each sampled by the policy after as many updates; async, iteration n >= 1 by n - 1's
    assert (versions, lag) == (([0, 1, 2], {0, 1}) if place == "async" else ([0, 1, 2, 3], {0}))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for version in versions:
        sampled = [row for row in rows if row["policy_version"] == version]
        if version == 0:  # the start: fresh adapters (B = 0) on the start model
            assert _gap(base, sampled, temperature) < 1e-4
            continue
        adapted = _peft_model(tiny_model_dir, lake.checkpoint_dir(RUN, version) / "adapter")
        assert _gap(adapted, sampled, temperature) < 1e-4, (place, version)
        assert _gap(base, sampled, temperature) > 1e-3, (place, version)  # not the base model's


@pytest.mark.parametrize("table", ["trajectories", "turns", "metrics", "evaluations"])
def test_the_launched_run_killed_and_resumed_holds_the_in_process_runs_rows(inprocess, launched, table):
    expected, actual = _rows(inprocess, table), _rows(launched, table)
    assert len(actual) == len(set(actual)) == len(expected) > 0
    assert actual == expected


def test_the_launched_runs_adapters_are_bitwise_the_in_process_runs(inprocess, launched):
    expected, actual = _adapters(inprocess), _adapters(launched)
    assert expected.keys() == actual.keys() and all("lora_" in name for name in expected)
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    manifest = DataLake(launched).read_manifest(RUN)
    assert manifest.status == "completed" and len(manifest.resumes) == 1


def test_zero3_and_async_runs_train_the_same_adapters_as_the_in_process_run(inprocess, zero3, request):
    """ZeRO-3 gathers the adapters from the ranks' partitions for the hand-off and the checkpoint: they land on the
    in-process run's up to float32 reduction order. The async run samples other batches, so its adapters differ."""
    expected = _adapters(inprocess)
    zero3 = _adapters(zero3)
    assert zero3.keys() == expected.keys()
    for name, want in expected.items():
        torch.testing.assert_close(zero3[name], want, rtol=1e-4, atol=1e-5, msg=name)
    assert _adapters(request.getfixturevalue("async")).keys() == expected.keys()
