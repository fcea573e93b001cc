"""How a failed request to the vLLM server is said (issue 39, item 2), without vLLM: what became of the server
process, and which request met the failure when a rollout's clean-up fails too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.rollout import RolloutSpec, run_rollouts
from ragen_core.rollout.vllm_local import process_fate as _fate


def _process(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_fate_of_a_killed_an_exited_and_a_live_server():
    killed = _process("import time; time.sleep(60)")
    killed.kill()
    assert _fate(killed) == "died (killed by SIGKILL)"
    exited = _process("raise SystemExit(3)")
    assert _fate(exited) == "died (exit status 3)"
    alive = _process("import time; time.sleep(60)")
    try:
        assert _fate(alive, grace=0.2) == "did not answer"
    finally:
        alive.kill()
        alive.wait()


class _DyingBackend:
    """Its first reset works; then the server is gone: every request fails, the clean-up's reset too."""

    behavior_source = "policy"

    def __init__(self) -> None:
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1
        if self.resets > 1:
            raise RuntimeError("reset after the rollout failed")

    def generate(self, contexts, seed):
        raise ConnectionError("generate met the dead server")


def test_a_failed_rollout_is_said_by_its_own_error_not_the_clean_ups(tiny_policy):
    _, tokenizer = tiny_policy
    backend = _DyingBackend()
    spec = RolloutSpec("bandit", [1, 2], 2, max_turns=1, max_actions_per_turn=1, max_actions_per_traj=1)
    with pytest.raises(ConnectionError, match="generate met the dead server"):
        run_rollouts(spec, backend, ChatFormatter(tokenizer), seed=0)
    assert backend.resets == 2  # the clean-up was still tried
