"""The rollout backends, registered by the name ``rollout.backend`` gives: each opens a
:class:`~ragen_core.rollout.sampling.Sampler` for a session.

- ``hf``: Hugging Face ``generate`` in this process, from the rollout copy of the policy (:class:`HFSampler`); when
  the run samples its training batches beside the learner (an async run), they come from a sampler process of its
  own instead (:class:`~ragen_core.rollout.sampler.SamplerProcess`), since the update changes the copy in place;
- ``vllm``: the vLLM rollout server, started with the session (:class:`VLLMSampler`); it holds a copy of its own, so
  it samples beside the learner as it is;
- ``scripted``: a registered Python policy (:class:`ScriptedSampler`, no weights).

A new backend is a sampler class and one registration, :func:`register_backend`; the config checks
``rollout.backend`` against :data:`BACKENDS` (``ragen_core.run.checks``), and nothing in ``ragen_core/run`` names a
backend.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragen_core.config import RunConfig
from ragen_core.registry import Registry
from ragen_core.rollout.sampling import NewWeights, Sampler, Sampling
from ragen_core.rollout.scripted import ScriptedBackend, scripted_options
from ragen_core.rollout.types import Generation, TurnContext
from ragen_core.storage import DataLake
from ragen_core.storage.layout import served_adapter_dir, served_adapter_versions, served_start_dir

if TYPE_CHECKING:  # torch and transformers load with the first sampler, not with the registry the config checks
    from ragen_core.rollout.hf_backend import HFBackend


@dataclass(frozen=True)
class RolloutSetup:
    """What a backend opens its sampler with: the run's config, its lake and id (where a process or server keeps its
    log), the model the run started from (its folder), the rollout copy of the policy (``model``, at the start
    weights) with its tokenizer, the precision the run computes in, and how many policy versions the run's batches
    may be sampled by at once (the schedule's: its staleness bound + 1; a vLLM server keeps that many LoRA versions
    resident)."""

    config: RunConfig
    lake: DataLake
    run_id: str
    model_dir: Path
    model: Any  # torch.nn.Module
    tokenizer: Any
    precision: str
    versions: int = 1  # the policy versions a batch may be sampled by at once: the schedule's staleness + 1


Opener = Callable[[RolloutSetup], Sampler]


@dataclass(frozen=True)
class Backend:
    """A registered backend: ``open`` makes the session's sampler; ``beside_learner``, when given, makes the sampler of
    an async run's training batches, for a backend whose own sampler reads the learner's module (which the update
    changes while the batches are sampled); ``check``, when given, says before the session loads anything that what
    the backend needs is there (raising what says how to get it)."""

    open: Opener
    beside_learner: Opener | None = None
    check: Callable[[RunConfig, Path], None] | None = None


BACKENDS: Registry[Backend] = Registry("rollout backend")


def register_backend(
    name: str, *, beside_learner: Opener | None = None, check: Callable[[RunConfig, Path], None] | None = None
) -> Callable[[Opener], Opener]:
    """Decorator: register the decorated opener as the backend ``name`` (``rollout.backend=name``), with the
    :class:`Backend`'s optional ``beside_learner`` and ``check``."""

    def decorator(opener: Opener) -> Opener:
        BACKENDS.add(name, Backend(opener, beside_learner, check))
        return opener

    return decorator


class HFSampler:
    """Hugging Face ``generate`` in this process, from ``model`` (the rollout copy: the learner's own module in
    process, or the copy a launched group's weights reach), one :class:`HFBackend` per sampling settings."""

    behavior_source = "policy"

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model, self.tokenizer = model, tokenizer
        self._backends: dict[Sampling, HFBackend] = {}
        self.version: int | None = 0  # the copy holds the start weights until the first hand-off

    def generate(self, contexts: list[TurnContext], seed: int, sampling: Sampling) -> list[Generation]:
        """One reply per context, from the model at ``sampling``."""
        backend = self._backends.get(sampling)
        if backend is None:
            from ragen_core.rollout.hf_backend import HFBackend

            backend = HFBackend(
                self.model,
                self.tokenizer,
                sampling.temperature,
                sampling.max_new_tokens,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
            )
            self._backends[sampling] = backend
        return backend.generate(contexts, seed)

    def reset(self) -> None:
        """Forget every backend's per-rollout key/value caches."""
        for backend in self._backends.values():
            backend.reset()

    def load(self, weights: NewWeights) -> None:
        """Nothing to copy: the sampler reads the rollout copy, which holds the new weights already."""
        if weights.module is not self.model:
            raise ValueError("the Hugging Face sampler reads the session's rollout copy; it was handed another module")
        self.version = weights.version

    def close(self) -> None:
        """Nothing runs apart from this process."""
        self._backends.clear()


class VLLMSampler:
    """The session's vLLM rollout servers (a :class:`~ragen_core.rollout.vllm_backend.ServerPool`). For a LoRA policy
    (``adapters``: the run's server folder, where each version's adapter folder is written) the servers keep the base
    model resident and the adapters of the last ``keep`` versions beside it; every request names the version the
    sampler holds."""

    behavior_source = "policy"

    def __init__(self, server: Any, tokenizer: Any, adapters: Path | None = None, keep: int = 1) -> None:
        self.server, self.tokenizer = server, tokenizer
        self.adapters, self.keep = adapters, keep
        self.version: int | None = 0  # the server starts on the start weights

    def generate(self, contexts: list[TurnContext], seed: int, sampling: Sampling) -> list[Generation]:
        """One reply per context, sampled by the server at ``sampling``."""
        from ragen_core.rollout.vllm_backend import VLLMBackend

        backend = VLLMBackend(
            self.server,
            self.tokenizer,
            sampling.temperature,
            sampling.max_new_tokens,
            sampling.top_p,
            sampling.top_k,
            adapter=self.version if self.adapters is not None else None,
        )
        return backend.generate(contexts, seed)

    def reset(self) -> None:
        """The server forgets its cached prefixes (before and after every rollout)."""
        self.server.reset_prefix_cache()

    def load(self, weights: NewWeights) -> None:
        """The server reloads the weights' export and is checked against ``weights.module``; a LoRA policy's
        adapters (megabytes) are written from the module and loaded as their version's, the older ones unloaded."""
        if self.adapters is None:
            self.server.load_weights(weights.export(), reference=weights.module)
        elif weights.version is None:
            raise ValueError("a LoRA policy's adapters are served by version: the hand-off must name its version")
        else:
            from ragen_core.policy.lora import save_adapter

            folder = served_adapter_dir(self.adapters, weights.version)
            shutil.rmtree(folder, ignore_errors=True)  # a version handed over again (a resume) is written afresh
            save_adapter(weights.module, folder)
            self.server.load_adapter(folder, weights.version, self.keep, reference=weights.module)
            for old in served_adapter_versions(self.adapters):  # read by the server, which unloaded them too
                if old <= weights.version - self.keep:
                    shutil.rmtree(served_adapter_dir(self.adapters, old), ignore_errors=True)
        self.version = weights.version

    def relabel(self, weights: NewWeights) -> None:
        """The weights the server holds stand for ``weights.version`` now, unchanged: nothing is reloaded (the
        version 0 export names the start model folder, not the merged start the server loaded); a LoRA policy's
        adapters are loaded again under the new version, which every request names."""
        if self.adapters is not None:
            self.load(weights)
        else:
            self.version = weights.version

    def close(self) -> None:
        """Stop the server (idempotent)."""
        self.server.close()


class ScriptedSampler:
    """Replies written by the registered scripted policy ``policy`` (``rollout.scripted_policy``), with ``options``
    (:func:`scripted_options`); no weights, no log-probs."""

    behavior_source = "scripted"

    def __init__(self, policy: str, tokenizer: Any, options: dict[str, Any]) -> None:
        self.backend = ScriptedBackend(policy, tokenizer, options)

    def generate(self, contexts: list[TurnContext], seed: int, sampling: Sampling) -> list[Generation]:
        """One scripted reply per context (the sampling settings do not apply)."""
        return self.backend.generate(contexts, seed)

    def load(self, weights: NewWeights) -> None:
        """A scripted policy has no weights."""

    def close(self) -> None:
        """Nothing to stop."""


def sampler_process(setup: RolloutSetup) -> Sampler:
    """The Hugging Face backend in a sampler process of its own (``rollout.sampler_threads`` torch threads, its log
    under the run's folder), at the rollout copy's weights once the session hands them over."""
    from ragen_core.rollout.sampler import SamplerProcess

    folder = setup.lake.sampler_dir(setup.run_id)
    folder.mkdir(parents=True, exist_ok=True)
    threads = setup.config.rollout.sampler_threads
    return SamplerProcess.start(setup.model_dir, setup.model, threads, folder / "sampler.log")


@register_backend("hf", beside_learner=sampler_process)
def hf_sampler(setup: RolloutSetup) -> Sampler:
    """Hugging Face ``generate`` from the rollout copy."""
    return HFSampler(setup.model, setup.tokenizer)


def check_vllm(config: RunConfig, data_root: Path) -> None:
    """The vLLM environment is built when the run starts a server, and the rollout token is set when it uses servers
    started elsewhere (else :class:`~ragen_core.rollout.vllm_client.BackendUnavailable`, how to)."""
    from ragen_core.rollout.vllm_client import RemoteServer, rollout_token
    from ragen_core.rollout.vllm_local import vllm_python

    if "local" in config.rollout.vllm.servers:
        vllm_python(config.rollout.vllm.python, data_root)
    remote = [entry for entry in config.rollout.vllm.servers if entry != "local"]
    token = rollout_token() if remote else ""
    for entry in remote:  # each answers and knows the token (its settings are checked when the run connects)
        RemoteServer(entry, token, f"the vLLM server at {entry}").known_health()


@register_backend("vllm", check=check_vllm)
def vllm_sampler(setup: RolloutSetup) -> Sampler:
    """The run's vLLM rollout servers (``rollout.vllm.servers``), each checked to compute what the rollout copy
    computes: the start model (with ``model.adapter`` merged into it, a folder written for the servers; pushed into
    the servers started elsewhere), and for a LoRA policy its start adapters, loaded as version 0 (a server started
    elsewhere must have been started on the policy's base model: the check after the load says so otherwise)."""
    config, folder = setup.config, setup.lake.vllm_server_dir(setup.run_id)
    start = setup.model_dir
    if config.model.adapter is not None and config.actor.lora is None:  # the rollout copy holds the merged model
        from ragen_core.policy.loading import save_policy

        start = served_start_dir(folder)
        shutil.rmtree(start, ignore_errors=True)
        save_policy(setup.model, setup.tokenizer, start)
    pool = open_servers(config, folder, start, setup.precision, setup.lake.root, setup.versions)
    try:
        from ragen_core.rollout.vllm_client import RemoteServer

        if config.actor.lora is None:  # (a LoRA policy's base is the model a server was started on: checked below)
            for server in pool.servers:  # one started elsewhere holds whatever it was started on or last given
                if isinstance(server, RemoteServer):
                    server.load_weights(start)
            pool.check_weights(setup.model)  # every server computes what the trainer's model computes
            return VLLMSampler(pool, setup.tokenizer)
        sampler = VLLMSampler(pool, setup.tokenizer, folder, keep=setup.versions)
        sampler.load(NewWeights(setup.model, version=0))  # the start adapters, checked as every version is
        return sampler
    except BaseException:
        pool.close()
        raise


@register_backend("scripted")
def scripted_sampler(setup: RolloutSetup) -> Sampler:
    """The config's scripted policy."""
    return ScriptedSampler(setup.config.rollout.scripted_policy, setup.tokenizer, scripted_options(setup.config))


def open_servers(
    config: RunConfig,
    folder: Path,
    model_dir: Path,
    precision: str,
    data_root: Path | None = None,
    versions: int = 1,
) -> Any:
    """The run's rollout servers as one :class:`~ragen_core.rollout.vllm_backend.ServerPool`: each ``local`` entry
    started on ``model_dir`` (all at once; logs in ``folder``), each URL connected to and checked to serve the run's
    precision (and a LoRA policy's rank, ``versions`` resident at once)."""
    from ragen_core.rollout.vllm_backend import ServerPool, served_lora_rank
    from ragen_core.rollout.vllm_client import PRECISIONS, RemoteServer, rollout_token

    settings, lora = config.rollout.vllm, config.actor.lora
    entries = settings.servers
    several = len(entries) > 1

    def one(number: int, entry: str) -> Any:
        name = f"the vLLM server {number + 1} of {len(entries)}" if several else "the vLLM server"
        if entry == "local":
            log = "server.log" if number == 0 else f"server-{number + 1}.log"
            return start_vllm_server(config, folder, model_dir, precision, data_root, versions, name, log)
        tolerance = settings.check_tolerance or (1e-4 if precision == "fp32" else 0.1)
        return RemoteServer.connect(
            entry,
            rollout_token(),
            f"{name} at {entry}" if several else f"the vLLM server at {entry}",
            dtype=PRECISIONS[precision],
            lora_rank=served_lora_rank(lora.rank) if lora is not None else None,
            loras=versions,
            tolerance=tolerance,
            timeout=settings.startup_timeout,  # a server its host started with the run may still be loading
        )

    servers: list[Any] = [None] * len(entries)
    errors: list[Exception] = []

    def open_one(number: int) -> None:
        try:
            servers[number] = one(number, entries[number])
        except Exception as exc:  # noqa: BLE001 - raised below, once every start has ended
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(n,), daemon=True) for n in range(1, len(entries))]
    try:
        for thread in threads:
            thread.start()
        open_one(0)
        for thread in threads:
            thread.join()
        if not errors:
            return ServerPool(_distinct(servers, entries), settings.shards, settings.on_server_loss)
        raise errors[0]
    except BaseException:  # a failed start, or Ctrl-C at once (a server still starting ends with this process)
        for server in servers:
            if server is not None:
                server.close()
        raise


def _distinct(servers: list[Any], entries: list[str]) -> list[Any]:
    """``servers``, once no two entries reached the same server (each holds a random tag of its own; a URL spelt
    two ways would see its weights pushed twice and refuse every request); else BackendUnavailable."""
    from ragen_core.rollout.vllm_client import BackendUnavailable

    seen: dict[str, str] = {}
    for server, entry in zip(servers, entries, strict=True):
        if server.weights is not None and server.weights in seen:
            raise BackendUnavailable(
                f"rollout.vllm.servers lists one server twice ({seen[server.weights]} and {entry} answer as the same "
                "server): list it once"
            )
        seen[server.weights] = entry
    return servers


def start_vllm_server(
    config: RunConfig,
    folder: Path,
    model_dir: Path,
    precision: str,
    data_root: Path | None = None,
    versions: int = 1,
    name: str = "the vLLM server",
    log_name: str = "server.log",
) -> Any:
    """A vLLM rollout server the run starts on ``model_dir`` (``rollout.vllm``; its log ``folder/log_name``; no vLLM
    environment found inside ``data_root`` is taken for the default one); a LoRA policy's ``versions`` resident at
    once."""
    from ragen_core.rollout.vllm_backend import served_lora_rank
    from ragen_core.rollout.vllm_client import PRECISIONS
    from ragen_core.rollout.vllm_local import VLLMServer, vllm_python

    settings, lora = config.rollout.vllm, config.actor.lora
    return VLLMServer.start(
        vllm_python(settings.python, data_root),
        model_dir,
        folder,
        dtype=PRECISIONS[precision],
        seed=config.seed,
        enforce_eager=settings.enforce_eager,
        prefix_caching=settings.prefix_caching,
        max_model_len=settings.max_model_len,
        kv_cache_gib=settings.kv_cache_gib,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        tensor_parallel_size=settings.tensor_parallel_size,
        startup_timeout=settings.startup_timeout,
        check_tolerance=settings.check_tolerance,
        max_lora_rank=served_lora_rank(lora.rank) if lora is not None else None,
        max_loras=versions,  # the versions a run's batches may be sampled by at once
        name=name,
        log_name=log_name,
    )
