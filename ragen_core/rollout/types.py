"""Records produced by rollouts: one per turn and one per trajectory, token-exact."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragen_core.agent import ParsedResponse
from ragen_core.tools import CallRecord


@dataclass(frozen=True)
class Generation:
    """One sampled reply: its token ids (ending with the stop token unless truncated), the sampler's log-prob of
    each token (after temperature; None for scripted replies) and the decoded text."""

    token_ids: list[int]
    logprobs: list[float] | None
    text: str
    truncated: bool


@dataclass(frozen=True)
class TurnContext:
    """What a backend sees when asked for one reply."""

    prompt_ids: list[int]
    env: Any
    actions_left: int
    max_actions_per_turn: int
    enable_think: bool
    reply_prefix: str = ""  # what the prompt ended with: the reply (as parsed) is this plus the generated text
    tool_parser: str = "hermes"  # a tool env: the format its calls are written in (rollout.tool_parser)
    group: int = 0  # the trajectory's group (a sharded backend serves a group's requests together)


@dataclass
class TurnRecord:
    """One turn of a trajectory."""

    turn_index: int
    observation: str
    response: str
    think: str
    answer: str
    actions: list[str]
    valid: bool
    format_ok: bool
    reward: float
    penalty: float
    done: bool
    truncated: bool
    response_tokens: int
    info: dict[str, Any] = field(default_factory=dict)
    tool_calls: list[dict[str, Any]] | None = None  # a tool env: each call's record (ragen_core.tools.CallRecord)


@dataclass
class TurnOutcome:
    """What a reply's actions did: the reply as parsed (its format penalty and the end reason read it), the env
    reward collected, whether the env ended the episode (``terminated``) or cut it (``truncated``), the actions run
    (canonical names; a tool env's calls as JSON), each step's info, and a tool env's records of every call read (run
    or not) and its text after the last call run (None: none ran)."""

    parsed: ParsedResponse
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    executed: list[str] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    records: list[CallRecord] = field(default_factory=list)
    state: str | None = None
    calls_read: int = 0  # a tool env: the calls the parser found in the reply, run or not


@dataclass
class TrajectoryRecord:
    """A whole multi-turn trajectory as ONE training row.

    ``input_ids`` is the full chat; ``loss_mask`` is 1 on tokens the policy sampled; ``behavior_logprobs`` holds the
    sampler's log-prob at sampled positions and 0.0 elsewhere (None for scripted trajectories). In the windowed
    context modes the row holds one independent sequence per turn (that turn's window prompt, then its reply),
    back to back, and ``segment_lengths`` their lengths; None in full mode (the row is one sequence).
    """

    env: str
    group_id: int
    traj_index: int
    env_seed: int
    behavior_source: str
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    behavior_logprobs: list[float] | None = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    success: bool = False
    env_reward: float = 0.0
    format_penalty: float = 0.0
    num_actions: int = 0
    segment_lengths: list[int] | None = None
    end_reason: str = ""  # why the trajectory ended (ragen_core.rollout.engine.END_REASONS, or the env's own word)
    final_state: str = ""  # the env's state after the last step: what the last turn's actions led to

    def add_context(self, ids: list[int]) -> None:
        """Append ``ids``, text the policy did not write (a prompt, the env's messages), to the sequence: loss mask 0,
        log-prob 0."""
        self.input_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        if self.behavior_logprobs is not None:
            self.behavior_logprobs.extend([0.0] * len(ids))

    @property
    def total_reward(self) -> float:
        """The trajectory's training score: env rewards plus format penalties."""
        return self.env_reward + self.format_penalty

    @property
    def truncated(self) -> bool:
        return any(turn.truncated for turn in self.turns)

    @property
    def response_length(self) -> int:
        return int(sum(self.loss_mask))
