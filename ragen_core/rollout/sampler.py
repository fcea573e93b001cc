"""A sampler of its own: the Hugging Face rollout backend in a child process, for asynchronous StarPO.

With ``trainer.max_staleness`` >= 1 the learner updates while the next batches are generated. Generation in the
learner's own process would share its interpreter and its copy of the weights (which the update changes in place),
so the Hugging Face backend runs in a child process of its own (``python -m ragen_core.rollout.sampler``, the name an
async run's sampler process goes by: :data:`PROGRAM`), holding its own copy of the policy in
``rollout.sampler_threads`` torch threads. The run's process keeps the environments and the rollout loop
(:func:`ragen_core.rollout.run_rollouts`): it only sends each turn's prompts, and the child sends back the sampled
replies with their log-probs, exactly as :class:`~ragen_core.rollout.hf_backend.HFBackend` makes them in the learner's
process. :class:`SamplerProcess` is a :class:`~ragen_core.rollout.sampling.Sampler`.

Weights reach the child at the hand-off after an update (:meth:`SamplerProcess.load`): the run's process copies its
rollout model into a shared-memory buffer (:mod:`ragen_core.rollout.handoff`), the child copies the buffer into its
model. The bytes are the module's own, so the sampler computes with exactly the weights of the policy version the
schedule names; with a fixed thread count its batches are reproducible, which an async run's exact resume needs. A
LoRA policy (a PEFT wrap) is copied whole once, when the child starts (its base, through a buffer dropped after the
start), and the child wraps its model with the same adapters; every hand-off after that carries the adapters only.

The child is started in a session of its own (``start_new_session=True``): a Ctrl-C in the terminal, which reaches
the command's whole process group, reaches the learner alone, which then stops the child
(:meth:`SamplerProcess.close`). The child exits when the run's process goes away (its end of the socket closes).
Messages are pickled over a socket pair between these two processes only: nothing read from the data root is
unpickled.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from ragen_core.policy.lora import adapter_settings, is_adapted
from ragen_core.rollout.handoff import SharedWeights, WeightLayout
from ragen_core.rollout.sampling import NewWeights, Sampling
from ragen_core.rollout.types import Generation, TurnContext
from ragen_core.rollout.vllm_local import (  # a dead sampler is told in a dead vLLM server's words
    last_line,
    process_fate,
)

STARTUP_TIMEOUT_S = 300.0
# The program the child runs: the run layer's name for an async run's sampler process (ps and the tests find it by
# it), whose body is :func:`main` here.
PROGRAM = "ragen_core.rollout.sampler"


class SamplerError(RuntimeError):
    """The sampler process failed (its message says where) or died."""


class SamplerProcess:
    """The child process that samples with its own copy of the policy (a :class:`~ragen_core.rollout.sampling.Sampler`
    whose replies carry their log-probs)."""

    behavior_source = "policy"

    def __init__(self, process: subprocess.Popen, connection: Connection, shared: SharedWeights, log: Path) -> None:
        self.process, self.connection, self.shared, self.log = process, connection, shared, log
        self.version: int | None = 0  # what the child holds: the session's start weights until a load confirms more

    @classmethod
    def start(cls, model_dir: Path, module: torch.nn.Module, threads: int, log: Path) -> SamplerProcess:
        """A sampler on ``model_dir`` (its tokenizer and architecture; the weights come from ``module`` through
        :meth:`load`, which the caller does before the first batch) with ``threads`` torch threads; its stderr
        goes to ``log``. Waits until the child has loaded the model. The child is in a session of its own, so a
        Ctrl-C meant for the run reaches the learner alone (which then stops the child in :meth:`close`); when the
        learner dies, the child reads the end of its socket and exits."""
        adapted = is_adapted(module)
        layout = WeightLayout.of_module(module)  # what a hand-off carries: a LoRA policy's adapters alone
        shared = SharedWeights.create(layout)
        parent, child = socket.socketpair()
        try:
            with open(log, "ab") as stderr:
                process = subprocess.Popen(
                    [sys.executable, "-m", PROGRAM, str(child.fileno())],
                    pass_fds=(child.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=stderr,
                    stderr=stderr,
                    start_new_session=True,  # a Ctrl-C in the terminal reaches the learner, which stops it
                )
        except BaseException:
            shared.unlink()
            parent.close()
            raise
        finally:
            child.close()
        connection = Connection(parent.detach())
        sampler = cls(process, connection, shared, log)
        dtype = str(next(module.parameters()).dtype).removeprefix("torch.")
        init = {
            "model_dir": str(model_dir),
            "dtype": dtype,
            "threads": threads,
            "weights": str(shared.path),
            "layout": layout.to_json(),
        }
        whole = None
        try:
            if adapted:  # the base, once: the child wraps its model as this one and copies it all in
                whole = SharedWeights.create(WeightLayout.of_module(module, trainable_only=False))
                whole.write(dict(module.named_parameters()))
                init.update(lora=adapter_settings(module), whole=str(whole.path), whole_layout=whole.layout.to_json())
            sampler._call("init", init, timeout=STARTUP_TIMEOUT_S)
        except BaseException:
            sampler.close()
            raise
        finally:
            shared.unlink()  # both processes have it mapped: nothing is left behind when either dies
            if whole is not None:
                whole.unlink()  # the child has read it: its memory goes with this last mapping
        return sampler

    def load(self, weights: NewWeights) -> None:
        """Hand the weights of ``weights.module`` to the child (the policy version its next batch is sampled with)."""
        self.shared.write(dict(weights.module.named_parameters()))
        self.version = self._call("load", weights.version)  # the child's echo (a failed load keeps the old one)

    def generate(self, contexts: list[TurnContext], seed: int, sampling: Sampling) -> list[Generation]:
        """One reply per context, sampled in the child from ``seed`` at ``sampling`` (the environment stays here).
        Each prompt goes with its list's identity in this process: the engine extends a rollout's prompt list in
        place from turn to turn, and the backend continues a turn's key/value cache only for the same list
        (:mod:`~ragen_core.rollout.kv_reuse`), so the child keeps one list per identity and extends it the same way."""
        settings = (sampling.temperature, sampling.max_new_tokens, sampling.top_p, sampling.top_k)
        plain = [(id(context.prompt_ids), dataclasses.replace(context, env=None)) for context in contexts]
        return self._call("generate", (settings, plain, seed))

    def reset(self) -> None:
        """Forget the child's per-rollout key/value caches and prompt lists (as :meth:`HFBackend.reset`)."""
        self._call("reset", None)

    def _call(self, kind: str, payload: Any, timeout: float | None = None) -> Any:
        """Send one request and wait for its answer; the child's failure, or its death, is a :class:`SamplerError`
        whose one line names the process and its log, as a vLLM server's death is told."""
        try:
            self.connection.send((kind, payload))
            if timeout is not None and not self.connection.poll(timeout):
                raise SamplerError(
                    f"the sampler process did not answer {kind!r} within {timeout:.0f} s (its log: {self.log})"
                )
            status, answer = self.connection.recv()
        except (EOFError, OSError) as exc:  # its end of the socket closed: the child is gone
            raise SamplerError(
                f"the sampler process (pid {self.process.pid}) {process_fate(self.process)} during {kind!r} "
                f"({exc or type(exc).__name__}); see its log {self.log}{last_line(self.log)}"
            ) from None
        if status == "error":
            raise SamplerError(f"the sampler process failed in {kind!r}: {answer}; see its log {self.log}")
        return answer

    def close(self) -> None:
        """Stop the child (idempotent): asked first, killed if it does not exit."""
        if self.process.poll() is None:
            try:
                self.connection.send(("stop", None))
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.connection.close()
        self.shared.unlink()


class _Prompts:
    """The child's prompt lists, one per identity in the run's process, extended in place as there."""

    def __init__(self) -> None:
        self.lists: dict[int, list[int]] = {}

    def resolve(self, key: int, context: TurnContext) -> TurnContext:
        """``context`` with its prompt as the list of ``key``: the same object, extended, when the prompt continues
        it; else a new list."""
        new, old = context.prompt_ids, self.lists.get(key)
        if old is not None and len(new) >= len(old) and new[: len(old)] == old:
            old.extend(new[len(old) :])
        else:
            old = self.lists[key] = list(new)
        return dataclasses.replace(context, prompt_ids=old)


def _init(payload: dict[str, Any]) -> tuple[Any, Any, SharedWeights]:
    """The child's model (at the learner's dtype, on the first GPU if any; a LoRA policy's wrapped with the same
    adapters and its whole weights copied in), its tokenizer and the mapped hand-off buffer."""
    from ragen_core.policy import load_policy
    from ragen_core.policy.lora import wrap_like

    torch.set_num_threads(int(payload["threads"]))
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    dtype = getattr(torch, payload["dtype"])
    model, tokenizer = load_policy(payload["model_dir"], dtype=dtype)
    if "lora" in payload:
        model = wrap_like(model, payload["lora"]).to(dtype)  # PEFT makes fp32 adapters: the learner's dtype instead
        SharedWeights.attach(payload["whole"], WeightLayout.from_json(payload["whole_layout"])).read_into(model)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
    model = model.to(device).eval()
    return model, tokenizer, SharedWeights.attach(payload["weights"], WeightLayout.from_json(payload["layout"]))


def _serve(connection: Connection) -> None:
    """The child's loop: ``init`` (load the model, map the weights), then ``load``, ``generate``, ``reset`` until
    ``stop`` or the parent's end closes."""
    from ragen_core.rollout.hf_backend import HFBackend

    model: Any = None
    shared: SharedWeights | None = None
    backends: dict[tuple[float, int, float, int], HFBackend] = {}
    tokenizer: Any = None
    prompts = _Prompts()
    while True:
        try:
            kind, payload = connection.recv()
        except (EOFError, OSError):
            return
        try:
            answer: Any = None
            if kind == "init":
                model, tokenizer, shared = _init(payload)
            elif kind == "load" and shared is not None:
                shared.read_into(model)
                answer = payload  # the version the buffer held, now the model's
            elif kind == "generate":
                settings, contexts, seed = payload
                backend = backends.get(settings)
                if backend is None:
                    temperature, max_new_tokens, top_p, top_k = settings
                    backend = HFBackend(model, tokenizer, temperature, max_new_tokens, top_p, top_k)
                    backends[settings] = backend
                answer = backend.generate([prompts.resolve(key, context) for key, context in contexts], seed)
            elif kind == "reset":
                prompts = _Prompts()
                for backend in backends.values():
                    backend.reset()
            elif kind == "stop":
                connection.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown request {kind!r}" + (" (before init)" if model is None else ""))
        except Exception as exc:  # the parent raises it, naming the request; the traceback goes to the log
            traceback.print_exc()
            connection.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        connection.send(("ok", answer))


def main(argv: list[str]) -> None:
    """The child's program (``python -m`` :data:`PROGRAM` ``FD``): serve the parent on the inherited socket ``FD``."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    connection = Connection(int(argv[0]))
    _serve(connection)


if __name__ == "__main__":
    main(sys.argv[1:])
