"""The sampler process samples what the Hugging Face backend samples in the learner's process, takes new weights at
the hand-off, and fails in one line when it dies; a Ctrl-C reaches the learner alone, and the sampler never outlives
its learner."""

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import NewWeights, RolloutSpec, SamplerBackend, Sampling, run_rollouts
from ragen_core.rollout.hf_backend import HFBackend
from ragen_core.rollout.sampler import SamplerError, SamplerProcess

pytestmark = pytest.mark.process  # sampler and learner processes

SPEC = RolloutSpec("sokoban", [5, 6], 2, max_turns=2, max_actions_per_turn=2, max_actions_per_traj=4)
AT = Sampling(1.0, 12)  # temperature 1, 12 new tokens, no top-p, no top-k


def _backend(sampler: SamplerProcess) -> SamplerBackend:
    """The rollout engine's backend over the sampler process (what a session's training backend is)."""
    return SamplerBackend(sampler, AT)


def _replies(records):
    return [(r.input_ids, r.loss_mask, r.behavior_logprobs) for r in records]


@pytest.fixture(scope="module")
def sampler(tiny_model_dir, tiny_policy, tmp_path_factory):
    model, _ = tiny_policy
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the child runs one thread: the same kernels, so the same bits
    process = SamplerProcess.start(tiny_model_dir, model, 1, tmp_path_factory.mktemp("sampler") / "sampler.log")
    yield process
    process.close()
    torch.set_num_threads(threads)


def test_the_sampler_process_samples_what_the_learners_process_samples(sampler, tiny_policy):
    model, tokenizer = tiny_policy
    formatter = ChatFormatter(tokenizer)
    sampler.load(NewWeights(model))
    here = run_rollouts(SPEC, HFBackend(model, tokenizer, 1.0, 12), formatter, seed=11)
    there = run_rollouts(SPEC, _backend(sampler), formatter, seed=11)
    assert _replies(there) == _replies(here)
    assert [r.total_reward for r in there] == [r.total_reward for r in here]


def test_the_hand_off_gives_the_sampler_the_new_weights_and_nothing_else(sampler, tiny_policy):
    model, tokenizer = tiny_policy
    formatter = ChatFormatter(tokenizer)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in changed.parameters():
            parameter.mul_(1.5)
    before = run_rollouts(SPEC, _backend(sampler), formatter, seed=4)
    sampler.load(NewWeights(changed))
    after = run_rollouts(SPEC, _backend(sampler), formatter, seed=4)
    expected = run_rollouts(SPEC, HFBackend(changed, tokenizer, 1.0, 12), formatter, seed=4)
    assert _replies(after) == _replies(expected) != _replies(before)
    sampler.load(NewWeights(model))
    again = run_rollouts(SPEC, _backend(sampler), formatter, seed=4)
    assert _replies(again) == _replies(before)


def test_a_dead_sampler_is_one_error_naming_its_exit_and_log(tiny_model_dir, tiny_policy, tmp_path):
    model, tokenizer = tiny_policy
    process = SamplerProcess.start(tiny_model_dir, model, 1, tmp_path / "sampler.log")
    try:
        process.process.kill()
        process.process.wait()
        with pytest.raises(SamplerError) as caught:
            run_rollouts(SPEC, _backend(process), ChatFormatter(tokenizer), seed=0)
        message = str(caught.value)
        # the words of a dead vLLM server (ragen_core.rollout.vllm_local): its fate, its log, the log's last line
        assert message.startswith(f"the sampler process (pid {process.process.pid}) died (killed by SIGKILL) during ")
        assert f"see its log {tmp_path / 'sampler.log'} (its last line: " in message
        assert "\n" not in message
    finally:
        process.close()


LEARNER = """
import sys, time
from pathlib import Path

import torch

from ragen_core.policy import load_policy
from ragen_core.rollout import NewWeights
from ragen_core.rollout.sampler import SamplerProcess

torch.set_num_threads(1)
model, _ = load_policy(sys.argv[1])
sampler = SamplerProcess.start(Path(sys.argv[1]), model, 1, Path(sys.argv[2]))
sampler.load(NewWeights(model))
try:  # the pid told inside: the test's Ctrl-C may come as soon as it is read
    print(sampler.process.pid, flush=True)
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    sampler.close()
    print("closed", flush=True)
"""


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie nobody reaps counts as gone)."""
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] in {"Z", "X"}
    except (FileNotFoundError, IndexError):
        return True


def _learner(tiny_model_dir, tmp_path):
    """A learner process of its own (in its own process group, as a command in a terminal) with a sampler; the
    learner and the sampler's pid."""
    script = tmp_path / "learner.py"
    script.write_text(LEARNER)
    command = [sys.executable, str(script), str(tiny_model_dir), str(tmp_path / "sampler.log")]
    learner = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert learner.stdout is not None
    return learner, int(learner.stdout.readline())


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _gone(pid)


def test_a_ctrl_c_reaches_the_learner_alone_which_stops_the_sampler(tiny_model_dir, tmp_path):
    learner, child = _learner(tiny_model_dir, tmp_path)
    os.killpg(learner.pid, signal.SIGINT)  # what the terminal does: the whole foreground process group
    out, _ = learner.communicate(timeout=60)
    assert learner.returncode == 0 and out.strip() == "closed"
    assert _wait_gone(child, 10)
    log = (tmp_path / "sampler.log").read_text()
    assert "KeyboardInterrupt" not in log and "Traceback" not in log, log


def test_the_sampler_exits_when_its_learner_is_killed(tiny_model_dir, tmp_path):
    learner, child = _learner(tiny_model_dir, tmp_path)
    assert not _gone(child)
    os.kill(learner.pid, signal.SIGKILL)
    learner.wait(timeout=30)
    assert _wait_gone(child, 30)


def _adapted(model_dir, seed: int):
    """The model of ``model_dir`` with rank-4 adapters on the attention projections whose B matrices are not zero (so
    the adapted model differs from its base). Loaded from its folder as the sampler process loads it: MKL's results
    may change in the last bit with the weights' alignment in memory, which a copy made here would change."""
    from ragen_core.config import LoraConfig
    from ragen_core.policy import load_policy
    from ragen_core.policy.lora import wrap_lora

    settings = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
    wrapped = wrap_lora(load_policy(model_dir)[0], settings, seed).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return wrapped


def test_a_lora_policy_is_copied_whole_once_then_handed_over_by_its_adapters_alone(
    tiny_model_dir, tiny_policy, tmp_path
):
    from ragen_core.policy.lora import adapter_names

    model, tokenizer = tiny_policy
    formatter = ChatFormatter(tokenizer)
    first, second = _adapted(tiny_model_dir, 1), _adapted(tiny_model_dir, 2)
    with torch.no_grad():  # a base the start model's folder does not hold: only the start's whole copy brings it
        first.get_base_model().model.norm.weight.mul_(1.25)
        second.get_base_model().model.norm.weight.copy_(first.get_base_model().model.norm.weight)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    process = SamplerProcess.start(tiny_model_dir, first, 1, tmp_path / "sampler.log")
    try:
        layout = process.shared.layout
        assert layout.trainable_only and [e.name for e in layout.entries] == adapter_names(first)
        trained = sum(p.numel() * p.element_size() for p in first.parameters() if p.requires_grad)
        whole = sum(p.numel() * p.element_size() for p in first.parameters())
        assert trained <= layout.nbytes < trained + 64 * len(layout.entries) < whole / 10  # adapters, not the model
        assert not list(Path("/dev/shm").glob(f"ragen-weights-{os.getpid()}-*"))  # both buffers' names removed
        for adapted in (first, second):
            process.load(NewWeights(adapted))
            there = run_rollouts(SPEC, _backend(process), formatter, seed=3)
            here = run_rollouts(SPEC, HFBackend(adapted, tokenizer, 1.0, 12), formatter, seed=3)
            assert _replies(there) == _replies(here)
        base = run_rollouts(SPEC, HFBackend(model, tokenizer, 1.0, 12), formatter, seed=3)
        assert _replies(there) != _replies(base)
    finally:
        process.close()
        torch.set_num_threads(threads)
