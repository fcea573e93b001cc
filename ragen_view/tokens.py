"""A trajectory's tokens as the viewer shows them: decoded by the run's own tokenizer, cut into the turns the model
saw (each turn's context, then its reply), and each reply token with the values it can be coloured by: trained or not
(the loss mask), the sampler's log-prob, and the advantage the update gave it.

The advantage is not stored: it is recomputed here as the update computed it, from the same inputs
(:func:`ragen_core.update.inputs.update_inputs`: the iteration's kept training rows, in the update's order, each
row's trajectory named by its key) by the same function (:func:`ragen_core.update.advantages.update_advantages`: the
run's advantage estimator, then RAGEN-2's scalings). The viewer imports nothing of ``ragen_core.training``
(tests/test_architecture_layers.py). Where the update's advantage needs what the lake does not keep (a critic's
values, the reference policy's log-probs for a KL in the reward, the proximal policy's for an off-policy weight),
the viewer says so instead of showing a different number.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragen_core.storage import DataLake
from ragen_core.storage.statements import one_line

if TYPE_CHECKING:  # torch and the config load with the first advantage asked for, not with the viewer
    import torch

    from ragen_core.config import RunConfig
    from ragen_core.update.inputs import UpdateInputs

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# A user turn made of tool results, as Qwen2.5's template (and the tiny default's) renders the tool messages
TOOL_RESULT = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)
TOOL_RESPONSE = re.compile(r"(?:\s*<tool_response>\n.*?\n</tool_response>)+\s*", re.DOTALL)
REPLACEMENT = "\ufffd"  # what a decoder shows for the bytes of a character not yet complete
LEVELS = 9  # colour buckets per scale (CSS classes lp-0..8, adv-0..8)


@dataclass
class Token:
    """One token of a reply: its text, id, position in ``input_ids`` and the values it can be coloured by."""

    text: str
    id: int
    position: int
    trained: bool
    logprob: float | None = None
    advantage: float | None = None

    @property
    def probability(self) -> float | None:
        return None if self.logprob is None else math.exp(self.logprob)

    def level(self, mode: str, scale: float) -> int:
        """The colour bucket (0..LEVELS-1) of the token under ``mode``: ``logprob`` from improbable (0) to certain;
        ``advantage`` from the most negative (0) through zero (the middle) to the most positive (``scale``: the
        largest magnitude of the trajectory's advantages)."""
        if mode == "logprob" and self.logprob is not None:
            return min(LEVELS - 1, int(math.exp(self.logprob) * LEVELS))
        if mode == "advantage" and self.advantage is not None and scale > 0:
            half = LEVELS // 2
            return half + max(-half, min(half, round(self.advantage / scale * half)))
        return -1


@dataclass
class Message:
    """A part of the context the model read: a role (``system``, ``user``, ... or ``context`` when the chat template
    marks no roles) and its text."""

    role: str
    text: str


@dataclass
class TurnView:
    """Turn ``index`` as the model saw it: the context before its reply, the reply's tokens, and the turn's row of the
    ``turns`` table (its observation, think, answer, reward...), when there is one."""

    index: int
    context: list[Message]
    reply: list[Token]
    row: dict[str, Any] | None = None


@dataclass
class TokenView:
    """A trajectory's turns, the notes on what could not be shown, and the advantage scale."""

    turns: list[TurnView] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    decoded: bool = True
    advantage_scale: float = 0.0


@functools.lru_cache(maxsize=8)
def tokenizer_of(model_dir: str) -> Any:
    """The tokenizer of a local model folder (remote code refused), cached per folder."""
    from ragen_core.policy.loading import load_tokenizer

    return load_tokenizer(model_dir)


def _messages(text: str) -> list[Message]:
    """A chat template's rendered context as its messages (``<|im_start|>role ... <|im_end|>``), a user turn of tool
    results (``<tool_response>`` blocks) as one ``tool`` message per result; the text as one ``context`` message when
    it has no such markers."""
    if IM_START not in text:
        return [Message("context", text)] if text else []
    messages = []
    head, *chunks = text.split(IM_START)
    if head.strip():
        messages.append(Message("context", head))
    for chunk in chunks:
        role, _, body = chunk.partition("\n")
        body = body.replace(IM_END, "").strip("\n")
        if role.strip() == "user" and TOOL_RESPONSE.fullmatch(body):  # a tool env's results (Qwen2.5's template)
            messages += [Message("tool", result) for result in TOOL_RESULT.findall(body)]
        else:
            messages.append(Message(role.strip() or "context", body))
    return messages


def _runs(mask: list[int], start: int, end: int) -> list[tuple[int, int, int]]:
    """``(value, start, end)`` of the constant stretches of ``mask[start:end]``."""
    stretches: list[tuple[int, int, int]] = []
    for position in range(start, end):
        if stretches and stretches[-1][0] == mask[position]:
            value, first, _ = stretches[-1]
            stretches[-1] = (value, first, position + 1)
        else:
            stretches.append((mask[position], position, position + 1))
    return stretches


def token_view(
    row: dict[str, Any], turns: list[dict[str, Any]], model_dir: str | None, advantages: list[float] | None = None
) -> TokenView:
    """The trajectory ``row`` (with ``input_ids``, ``loss_mask``, ``behavior_logprobs``, ``segment_lengths``) as
    turns: each a context (mask 0) followed by a reply (mask 1); with ``segment_lengths`` (a windowed context mode)
    each segment is one turn's window then its reply, and nothing of one window spills into the next. ``turns`` rows
    are matched to the replies in order. A row whose lists do not fit its ids raises ValueError (a damaged row)."""
    view = TokenView()
    ids = [int(x) for x in row.get("input_ids") or []]
    mask = [int(x) for x in row.get("loss_mask") or []]
    logprobs = row.get("behavior_logprobs")
    segments = [int(n) for n in row.get("segment_lengths") or [len(ids)]]
    for name, values in (("loss_mask", mask), ("behavior_logprobs", logprobs), ("advantages", advantages)):
        if values is not None and len(values) != len(ids):
            raise ValueError(f"the row's {name} has {len(values)} entries for its {len(ids)} token ids (damaged?)")
    if sum(segments) != len(ids) or min(segments, default=1) < 0:
        raise ValueError(f"the row's segment_lengths {segments} do not split its {len(ids)} token ids (damaged?)")
    decoder = _Decoder(model_dir, view)
    start = 0
    for length in segments:
        context: list[str] = []
        for value, first, end in _runs(mask, start, start + length):
            if value == 0:
                context.append(decoder.text(ids[first:end]))
                continue
            pieces = decoder.pieces(ids[first:end])
            reply = [
                Token(
                    pieces[p - first],
                    ids[p],
                    p,
                    True,
                    None if logprobs is None else float(logprobs[p]),
                    None if advantages is None else float(advantages[p]),
                )
                for p in range(first, end)
            ]
            view.turns.append(TurnView(len(view.turns), _messages("".join(context)), reply))
            context = []
        if context:  # what followed the last reply of this sequence (the env's last observation, in the full chat)
            view.turns.append(TurnView(len(view.turns), _messages("".join(context)), []))
        start += length
    replies = [t for t in view.turns if t.reply]
    if len(replies) == len(turns):
        for turn, turn_row in zip(replies, turns, strict=True):
            turn.row = turn_row
    elif turns:
        view.notes.append(
            f"the sequence holds {len(replies)} replies but the turns table {len(turns)} turns: the turns are "
            "listed after the sequence"
        )
    view.decoded = decoder.tokenizer is not None
    if advantages is not None:
        view.advantage_scale = max((abs(t.advantage or 0.0) for turn in view.turns for t in turn.reply), default=0.0)
    return view


class _Decoder:
    """Token ids as text by the run's own tokenizer: a stretch of context decoded whole (a character split over
    several byte-level tokens comes out whole), a reply token by token as what it adds to the text of the reply so
    far (a token that ends inside a character adds nothing until the one that completes it). ``#<id>`` for every
    token when the tokenizer cannot be loaded (the model folder moved or removed: said in the view's notes)."""

    def __init__(self, model_dir: str | None, view: TokenView) -> None:
        self.tokenizer = None
        if model_dir and Path(model_dir).is_dir():
            try:
                self.tokenizer = tokenizer_of(str(model_dir))
            except Exception as exc:  # noqa: BLE001 - any tokenizer failure leaves the ids readable as ids
                view.notes.append(
                    f"the run's tokenizer ({model_dir}) could not be loaded ({exc}): tokens shown as ids"
                )
        else:
            view.notes.append(f"the run's model folder {model_dir!r} is not on this machine: tokens shown as ids")

    def text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return "".join(f"#{i} " for i in ids)
        return self.tokenizer.decode(ids)

    def pieces(self, ids: list[int]) -> list[str]:
        if self.tokenizer is None:
            return [f"#{i} " for i in ids]
        pieces, done = [], ""
        for end in range(1, len(ids) + 1):
            text = self.tokenizer.decode(ids[:end]).rstrip(REPLACEMENT)  # an unfinished character: not yet shown
            pieces.append(text[len(done) :] if text.startswith(done) else self.tokenizer.decode(ids[end - 1 : end]))
            done = text
        return pieces


class AdvantageUnavailable(Exception):
    """The update's advantage of a row cannot be recomputed from what the lake keeps (the reason is the message)."""


def advantages(
    lake: DataLake,
    run_id: str,
    iteration: int,
    config_tree: dict[str, Any],
    kind: str,
    key: tuple[int, int],
) -> tuple[list[float], str | None]:
    """The advantage of each token of the training row ``key`` = (group_id, traj_index) of a ``train`` run (its
    ``kind``) as the update of ``iteration`` computed it (:func:`batch_advantages`; 0 outside the loss mask), and a
    note on what it leaves out (an off-policy correction's weights) or None; :class:`AdvantageUnavailable` when it
    cannot be recomputed from the lake (why, in its message)."""
    config = _trained_config(config_tree, kind)
    found = batch_advantages(lake, run_id, iteration, config)
    if found is None or key not in found[0].keys:
        raise AdvantageUnavailable(
            "no update trained on it: the variance filter dropped its group (or the row was never kept)"
        )
    inputs, values = found
    index = list(inputs.keys).index(key)
    length = int(inputs.batch.attention_mask[index].sum())
    note = None
    if config.algorithm.off_policy_correction != "none":
        note = (
            f"shown before the {config.algorithm.off_policy_correction} correction's per-token importance weight (the "
            "proximal policy's log-probs it needs are not kept)"
        )
    return [float(v) for v in values[index, :length]], note


def batch_advantages(
    lake: DataLake, run_id: str, iteration: int, config: RunConfig
) -> tuple[UpdateInputs, torch.Tensor] | None:
    """The inputs of ``iteration``'s update (``config``: the run's) and the advantages (B, T) it trained on, as the
    update made them: :func:`ragen_core.update.inputs.update_inputs`, then
    :func:`ragen_core.update.advantages.update_advantages`; None when the filter kept no group (no update). The pad
    id of the batch is 0: padding is outside every row's tokens and moves no advantage."""
    from ragen_core.update.advantages import token_rewards_for, update_advantages
    from ragen_core.update.inputs import update_inputs

    inputs = update_inputs(lake, run_id, iteration, config, 0)
    if inputs is None:
        return None
    values, _ = update_advantages(config.algorithm, inputs, token_rewards_for(inputs, config.algorithm.reward_level))
    return inputs, values


def _trained_config(config_tree: dict[str, Any], kind: str) -> RunConfig:
    """The stored config of a run whose update's advantages the lake can recompute; :class:`AdvantageUnavailable`
    saying why for any other (a run that makes no StarPO update, a config that does not load here, an update that
    needed what the lake does not keep)."""
    from ragen_core.algos.advantages import needs_critic
    from ragen_core.config.errors import ConfigError
    from ragen_core.config.loading import build_config, stored_config

    if kind != "train":
        raise AdvantageUnavailable(f"a {kind} run makes no StarPO update (its training is not on advantages)")
    try:  # plain data: it names no module and imports nothing of the user's
        config = build_config(stored_config(config_tree))
    except ConfigError as exc:
        raise AdvantageUnavailable(f"the run's stored config does not load here ({one_line(str(exc))})") from None
    algorithm = config.algorithm
    if needs_critic(algorithm.adv_estimator):
        raise AdvantageUnavailable(
            f"the {algorithm.adv_estimator} advantage needs the critic's values of that update, which the lake does "
            "not keep"
        )
    if algorithm.kl_mode == "reward" and algorithm.kl_coef > 0:
        raise AdvantageUnavailable("the KL penalty in the reward needs the reference policy's log-probs")
    if config.rollout.training_rows == "turn":
        raise AdvantageUnavailable("this run trained on one row per turn (rollout.training_rows=turn)")
    return config
