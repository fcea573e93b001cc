"""The user's own code, written into a temporary folder as a user would have it: an environment module, and an
installed distribution registering it under the entry-point group ``ragen.envs`` (a ``*.dist-info`` folder with its
``entry_points.txt`` on the import path: an installed distribution as far as ``importlib.metadata`` is concerned)."""

from __future__ import annotations

import uuid
from pathlib import Path

COIN_ENV = '''
from ragen_core.envs import TextEnv


class CoinEnv(TextEnv):
    """Name the side the coin shows: reward 1 for the side of the seed's parity."""

    name = "coin"

    def __init__(self, sides=("heads", "tails")):
        self.sides = list(sides)
        self.side, self.done, self.won = None, False, False

    def reset(self, seed):
        self.side, self.done, self.won = self.sides[int(seed) % 2], False, False
        return self.render(), {"success": False}

    def step(self, action):
        if action not in self.sides:
            return self.render(), 0.0, False, False, {"success": False, "action_is_valid": False,
                                                      "action_is_effective": False}
        self.done, self.won = True, action == self.side
        return self.render(), float(self.won), True, False, {"success": self.won, "action_is_valid": True,
                                                             "action_is_effective": True}

    def render(self):
        return "Done." if self.done else f"The coin shows {self.side}."

    @property
    def action_names(self):
        return list(self.sides)

    def instruction(self):
        return "Name the side the coin shows."

    @property
    def success(self):
        return self.won

    def reward_bounds(self, max_actions):
        return 0.0, 1.0

    def expert_plan(self, actions_left):
        return [self.side]


class NoBounds(TextEnv):
    def reset(self, seed):
        return "", {}
'''


def unique(prefix: str) -> str:
    """A module name no other test (nor an earlier import in this process) has used."""
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def write_env_module(folder: Path, module: str, marker: Path | None = None) -> str:
    """``<folder>/<module>.py`` defining ``CoinEnv`` (and ``NoBounds``, a TextEnv missing most of the protocol);
    with ``marker``, importing it creates that file. Returns the import path of ``CoinEnv``."""
    folder.mkdir(parents=True, exist_ok=True)
    touch = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n" if marker else ""
    (folder / f"{module}.py").write_text(touch + COIN_ENV)
    return f"{module}:CoinEnv"


def write_distribution(folder: Path, dist: str, version: str, entry: str, package: str) -> None:
    """An installed distribution ``dist`` ``version`` in ``folder``: package ``package`` holding ``CoinEnv``, and
    its dist-info whose entry point ``entry`` of ``ragen.envs`` names it."""
    (folder / package).mkdir(parents=True, exist_ok=True)
    (folder / package / "__init__.py").write_text(COIN_ENV)
    info = folder / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[ragen.envs]\n{entry} = {package}:CoinEnv\n")
    (info / "top_level.txt").write_text(f"{package}\n")
