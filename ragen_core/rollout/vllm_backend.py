"""Rollout backend on vLLM (``rollout.backend: vllm``): rollout servers in vLLM's own environment.

The servers (:mod:`ragen_core.rollout.vllm_client`): one the run starts (``local``) and any started elsewhere with
``ragen rollout serve`` (``rollout.vllm.servers``), served as one :class:`ServerPool`.

- Prompts go in as token ids and replies come back as token ids with the sampler's log-prob of each sampled token
  (after temperature and top-k/top-p, as the Hugging Face backend records them); nothing is re-tokenised. Each
  request carries its own seed, derived from (call seed, index in the call) as for the Hugging Face backend.
- Shards: each turn's requests are split into ``rollout.vllm.shards`` parts by group (group g in part g mod shards),
  each part one request with a cache salt of its own, and part k goes to server k mod (servers). A server answers one
  request at a time and a part's prefixes are cached apart from the others', so what a part samples depends on the
  part alone, never on which server serves it or how many there are: a run on two servers stores the rows of the same
  run on one (measured bitwise on the CPU; the rows do depend on the number of shards, which is in the config hash).
- New weights: after every update the trainer writes its Hugging Face export and every server reloads it in place,
  all at once (:meth:`ServerPool.load_weights`); then each scores a fixed probe sequence and the trainer compares it
  with its own model's log-probs, so a server left on old weights stops the run with an error instead of training
  off-policy. Every request names the weights pushed last: a server restarted meanwhile refuses it.
- A server that dies or fails a request stops the iteration in one line naming it (``rollout.vllm.on_server_loss:
  stop``); ``continue`` drops it for the rest of the session and sends its parts to the others (not bitwise: a part
  moved mid-rollout recomputes the prefixes the lost server had cached).
- Reproducibility: requests are seeded one by one, and the prefix cache (a multi-turn rollout's later turns reuse the
  keys and values of its earlier ones) is emptied before every rollout, so the same prompts, seeds and weights give
  the same replies across a restart of the server (tested by the resume tests).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from ragen_core.faults import maybe_kill_helper
from ragen_core.rollout.hf_backend import stop_token_ids
from ragen_core.rollout.types import Generation, TurnContext
from ragen_core.rollout.vllm_client import ServerClient, VLLMServerError
from ragen_core.seeding import derive_seed

PROBE_LENGTH = 64  # tokens in the sequence scored after every weight push


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM 0.32 accepts


def served_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that serves adapters of ``rank`` (it refuses other values)."""
    return next(allowed for allowed in VLLM_LORA_RANKS if allowed >= rank)


def probe_sequence(model: Any, length: int = PROBE_LENGTH) -> list[int]:
    """A fixed pseudo-random token sequence within the model's vocabulary (the same for every push)."""
    import torch

    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(20250420)
    return torch.randint(0, vocab, (length,), generator=generator).tolist()


def reference_logprobs(model: Any, sequence: list[int]) -> list[float]:
    """``model``'s log-prob of every token after the first of ``sequence`` (temperature 1), in float32."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([sequence], device=device)
    training = model.training
    model.eval()  # no dropout: the served model samples without it (an update leaves the module in training mode)
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float()
    finally:
        model.train(training)
    picked = logits.gather(1, ids[0, 1:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)
    return picked.tolist()


class ServerPool:
    """The run's rollout servers as one (see the module's docstring): each turn's requests in ``shards`` parts by
    group, part k served by server k mod (servers), one request at a time per server, the servers at once; weights
    pushed to every server at once. ``on_loss``: ``stop`` (a failing server fails the call) or ``continue`` (it is
    dropped, its parts served by the others)."""

    def __init__(self, servers: list[ServerClient], shards: int = 1, on_loss: str = "stop") -> None:
        if not servers:
            raise ValueError("a server pool needs at least one server")
        if shards < len(servers):
            raise ValueError(f"{shards} shard(s) keep at most {shards} of {len(servers)} servers busy")
        self.servers, self.shards, self.on_loss = list(servers), shards, on_loss
        self._listed_last = servers[-1]  # the server the tests' fault point kills
        self._dropping = threading.Lock()  # two lanes of an async run may see one server fail at once
        self.push_seconds: list[float] = []  # time of each push to every server (reload + check, all at once)

    def generate(
        self,
        prompts: list[list[int]],
        sampling: list[dict[str, Any]],
        adapter: int | None = None,
        groups: list[int] | None = None,
    ) -> list[dict[str, Any]]:
        """One completion per prompt, in prompt order; ``groups``: each prompt's group (its part: group mod shards)."""
        groups = groups if groups is not None else [0] * len(prompts)
        parts = [[i for i, group in enumerate(groups) if group % self.shards == k] for k in range(self.shards)]
        outputs: list[Any] = [None] * len(prompts)

        def serve(number: int, server: ServerClient, count: int) -> None:
            for k, indices in enumerate(parts):  # the parts of server ``number`` of ``count``, one request each
                if indices and k % count == number and outputs[indices[0]] is None:
                    salt = None if self.shards == 1 else f"shard-{k}"
                    chosen = [prompts[i] for i in indices], [sampling[i] for i in indices]
                    for i, answer in zip(indices, server.generate(*chosen, adapter, salt), strict=True):
                        outputs[i] = answer

        while any(answer is None for answer in outputs):  # again only after a lost server's parts moved
            count = len(self.servers)
            self._each(lambda number, server, count=count: serve(number, server, count))
        return outputs

    def _each(self, work: Any) -> list[Any]:
        """``work(number, server)`` for every server, all at once (a thread each but the first); a server that
        fails is dropped (and stopped, if the run started it) with a warning under ``on_loss=continue`` while others
        remain, else its error raised."""
        servers = list(self.servers)
        results: list[Any] = [None] * len(servers)
        errors: list[BaseException | None] = [None] * len(servers)

        def one(number: int) -> None:
            try:
                results[number] = work(number, servers[number])
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
                errors[number] = exc

        threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in range(1, len(servers))]
        for thread in threads:
            thread.start()
        one(0)
        if errors[0] is not None and not isinstance(errors[0], Exception):
            raise errors[0]  # Ctrl-C: at once (the other requests end with their servers, or time out)
        for thread in threads:
            thread.join()
        for server, error in zip(servers, errors, strict=True):
            if error is not None:
                self._drop(server, error)
        return results

    def _drop(self, server: ServerClient, error: BaseException) -> None:
        """Drop ``server`` for ``error`` under ``on_loss=continue`` when it is lost (gone, restarted) and others
        remain; else raise ``error`` (a request the server refused is no lost server)."""
        lost = isinstance(error, VLLMServerError) and error.lost
        with self._dropping:
            if server not in self.servers:  # the other lane dropped it already
                return
            if not lost or self.on_loss != "continue" or len(self.servers) == 1:
                raise error
            self.servers.remove(server)
            server.close()
            print(
                f"warning: {error}; continuing on the other {len(self.servers)} server(s) "
                "(rollout.vllm.on_server_loss=continue: this run's rows may differ from a run that kept it)",
                file=sys.stderr,
                flush=True,
            )

    def reset_prefix_cache(self) -> None:
        """Every server forgets its cached prefixes."""
        self._each(lambda _, server: server.reset_prefix_cache())

    def score(self, sequences: list[list[int]], adapter: int | None = None) -> list[list[float]]:
        """The first server's log-probs of ``sequences`` (all hold the same weights, checked at every push)."""
        return self.servers[0].score(sequences, adapter)

    def check_weights(self, reference: Any, tolerance: float | None = None, adapter: int | None = None) -> float:
        """Every server's largest log-prob difference from ``reference`` on the probe (an error above tolerance)."""
        expected = _expected(reference)
        found = self._each(lambda _, server: server.check_weights(reference, tolerance, adapter, expected))
        return max(value for value in found if value is not None)

    def load_weights(self, folder: Any, reference: Any = None) -> float:
        """Every server reloads the export in ``folder`` at once; with ``reference``, each is checked against it.
        Returns the largest log-prob difference."""
        started = time.perf_counter()
        expected = None if reference is None else _expected(reference)

        def push(_: int, server: ServerClient) -> float:
            server.load_weights(folder)
            return 0.0 if reference is None else server.check_weights(reference, expected=expected)

        found = self._each(push)
        self.push_seconds.append(time.perf_counter() - started)
        return max(value for value in found if value is not None)

    def load_adapter(self, folder: Any, version: int, keep: int, reference: Any = None) -> float:
        """Every server loads the adapters of ``version`` at once (:meth:`ServerClient.load_adapter`)."""
        started = time.perf_counter()
        expected = None if reference is None else _expected(reference)

        def push(_: int, server: ServerClient) -> float:
            server.load_adapter(folder, version, keep)
            return 0.0 if reference is None else server.check_weights(reference, adapter=version, expected=expected)

        found = self._each(push)
        self.push_seconds.append(time.perf_counter() - started)
        return max(value for value in found if value is not None)

    def helper_group(self) -> int | None:
        """The process group the tests' fault point kills: the last server listed, while it serves and runs on this
        machine (once dropped, nothing)."""
        if self._listed_last not in self.servers:
            return None
        return getattr(self._listed_last, "helper_group", lambda: None)()

    def close(self) -> None:
        """Stop the servers this run started (idempotent); those started elsewhere keep running."""
        for server in self.servers:
            server.close()


def _expected(reference: Any) -> tuple[list[int], list[float]]:
    """The probe sequence and ``reference``'s log-probs of it, computed once for every server's check."""
    probe = probe_sequence(reference)
    return probe, reference_logprobs(reference, probe)


class VLLMBackend:
    """Samples replies from a :class:`ServerPool` (or one server); same interface and records as the Hugging Face
    backend."""

    behavior_source = "policy"

    def __init__(
        self,
        server: ServerPool | ServerClient,
        tokenizer: Any,
        temperature: float,
        max_new_tokens: int,
        top_p: float = 1.0,
        top_k: int = 0,
        adapter: int | None = None,
    ) -> None:
        self.server = server if isinstance(server, ServerPool) else ServerPool([server])
        self.tokenizer = tokenizer
        self.adapter = adapter  # the adapter version every request names (None: the served model itself)
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.max_new_tokens = max_new_tokens
        self.stop_ids = stop_token_ids(tokenizer)

    def sampling(self, count: int, seed: int) -> list[dict[str, Any]]:
        """One settings dict per request, each seeded from (``seed``, its index) as the Hugging Face backend is."""
        return [
            {
                "temperature": self.temperature,
                "top_p": self.top_p,
                "top_k": self.top_k,
                "max_tokens": self.max_new_tokens,
                "seed": derive_seed(seed, index),
                "stop_token_ids": self.stop_ids,
            }
            for index in range(count)
        ]

    def reset(self) -> None:
        """Called by the rollout engine before and after every rollout: the rollout starts from an empty prefix cache
        (its later turns reuse its earlier turns' keys and values), so what it samples never depends on what the
        servers computed before it: a resumed run samples what the uninterrupted one did."""
        self.server.reset_prefix_cache()

    def generate(self, contexts: list[TurnContext], seed: int) -> list[Generation]:
        """Sample one reply per context; every request is seeded from ``seed`` and its index in the call."""
        group = self.server.helper_group()
        if group is not None:
            maybe_kill_helper("rollout", "server_killed", group)  # tests: a server dies mid-rollout
        prompts = [list(c.prompt_ids) for c in contexts]
        sampling = self.sampling(len(contexts), seed)
        outputs = self.server.generate(prompts, sampling, self.adapter, [c.group for c in contexts])
        return generations_from_outputs(outputs, self.tokenizer, self.stop_ids)


def generations_from_outputs(outputs: list[dict[str, Any]], tokenizer: Any, stop_ids: list[int]) -> list[Generation]:
    """Our records from the server's completions (one each, in prompt order).

    Each completion's token ids are cut after the first stop token (``truncated`` when there is none) with the
    log-prob of each kept token. Raises ``ValueError`` when a completion lacks a log-prob for a token.
    """
    stop = set(stop_ids)
    generations = []
    for number, output in enumerate(outputs):
        tokens = [int(token) for token in output["token_ids"]]
        logprobs = [float(value) for value in output["logprobs"]]
        if len(logprobs) != len(tokens):
            raise ValueError(f"vLLM output {number} has {len(logprobs)} log-probs for {len(tokens)} tokens")
        end = next((i + 1 for i, token in enumerate(tokens) if token in stop), None)
        if end is not None:
            tokens, logprobs = tokens[:end], logprobs[:end]
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        generations.append(Generation(tokens, logprobs, text, end is None))
    return generations
