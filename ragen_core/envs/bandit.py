"""Two-armed bandit (RAGEN's Bi-Arm Bandit): one turn, one action; success = picking the higher-expected-value arm.

The low-risk arm always pays ``low_reward`` (RAGEN's code: 0.1; the paper's appendix: 0.15); the high-risk arm pays
``high_reward`` with probability ``high_prob`` (1.0 w.p. 0.25, expected 0.25) and 0 otherwise. The order in which the
arms are listed is drawn from the seed, and so is the high arm's payout: all members of a group (same seed) see the
same draw, as in RAGEN.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ragen_core.envs.base import StepResult, TextEnv, bounded, bounded_reward, register_env


class BanditEnv(TextEnv):
    """A two-armed bandit whose arm names hint at their risk (e.g. Phoenix = low risk, Dragon = high risk)."""

    def __init__(
        self,
        low_name: str = "Phoenix",
        high_name: str = "Dragon",
        low_reward: float = 0.1,
        high_reward: float = 1.0,
        high_prob: float = 0.25,
        name: str = "bandit",
    ) -> None:
        if low_name.lower() == high_name.lower():
            raise ValueError(f"bandit arm names must differ, got {low_name!r} twice")
        bounded("high_prob", high_prob, 0.0, 1.0, integer=False)
        bounded_reward("low_reward", low_reward)
        bounded_reward("high_reward", high_reward)
        self.name = name
        self.low_name, self.high_name = low_name, high_name
        self.low_reward, self.high_reward, self.high_prob = low_reward, high_reward, high_prob
        self._arms: list[str] = [low_name, high_name]
        self._high_pays = False
        self._pulled: str | None = None

    @property
    def better_arm(self) -> str:
        """The arm with the higher expected reward."""
        return self.high_name if self.high_prob * self.high_reward > self.low_reward else self.low_name

    def expert_plan(self, actions_left: int = 1) -> list[str]:
        """The scripted expert's choice: the better arm."""
        return [self.better_arm]

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        rng = np.random.default_rng(seed)
        self._arms = [self.low_name, self.high_name] if rng.random() < 0.5 else [self.high_name, self.low_name]
        self._high_pays = bool(rng.random() < self.high_prob)
        self._pulled = None
        return self.render(), {"success": False}

    def step(self, action: str) -> StepResult:
        if self._pulled is not None:
            raise RuntimeError("bandit episode is over; call reset(seed) first")
        if action not in self._arms:
            info = {"success": False, "action_is_valid": False, "action_is_effective": False}
            return self.render(), 0.0, False, False, info
        self._pulled = action
        if action == self.low_name:
            reward = self.low_reward
        else:
            reward = self.high_reward if self._high_pays else 0.0
        info = {"success": self.success, "action_is_valid": True, "action_is_effective": True}
        return self.render(), float(reward), True, False, info

    def render(self) -> str:
        if self._pulled is None:
            return f"Two arms stand before you: {self._arms[0]} and {self._arms[1]}."
        return f"You pulled {self._pulled}."

    @property
    def action_names(self) -> list[str]:
        return list(self._arms)

    def instruction(self) -> str:
        first, second = self._arms
        return (
            "You play a two-armed bandit and want the highest reward on average. "
            f"The arms are {first} and {second}; each pays out from its own distribution, "
            "and the names hint at how risky each arm is. Pull exactly one arm."
        )

    @property
    def success(self) -> bool:
        return self._pulled == self.better_arm

    def end_reason(self) -> str:
        """``"worse_arm"`` when the pull was not the better arm, else ``"success"``."""
        return "success" if self.success else "worse_arm"

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        payouts = [self.low_reward, self.high_reward, 0.0]
        return min(payouts), max(payouts)


@register_env("bandit")
def make_bandit(**overrides: Any) -> BanditEnv:
    """Training names: Phoenix (low risk) and Dragon (high risk)."""
    return BanditEnv(**{"low_name": "Phoenix", "high_name": "Dragon", "name": "bandit", **overrides})


@register_env("bandit_test")
def make_bandit_test(**overrides: Any) -> BanditEnv:
    """Generalisation names: Trader (low risk) and Librarian (high risk)."""
    return BanditEnv(**{"low_name": "Trader", "high_name": "Librarian", "name": "bandit_test", **overrides})


@register_env("bandit_reversed")
def make_bandit_reversed(**overrides: Any) -> BanditEnv:
    """Reversed: the name that sounds safe (Phoenix) is the high-risk, better arm; Dragon pays the sure low reward."""
    return BanditEnv(**{"low_name": "Dragon", "high_name": "Phoenix", "name": "bandit_reversed", **overrides})
