"""What the pages draw, as plain data for the templates (which escape every text): line charts as SVG coordinates,
and an env's state as a grid of tiles where the env renders one (Sokoban, FrozenLake)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ragen_core.envs.frozen_lake import SYMBOLS as FROZEN_LAKE
from ragen_core.envs.sokoban import CLASSIC_SYMBOLS, NEW_VOCAB_SYMBOLS, SokobanSymbols

WIDTH, HEIGHT = 420, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 28
SERIES_COLOURS = 8  # CSS classes s0..s7; runs beyond take them again


@dataclass
class Line:
    """One run's polyline on a chart, its points (with their values, for the tooltips) and its colour class."""

    label: str
    colour: int
    points: str
    dots: list[tuple[float, float, str]]


@dataclass
class Chart:
    """A chart's title, its lines and its axis ticks (``(pixel, label)``)."""

    title: str
    metric: str
    lines: list[Line] = field(default_factory=list)
    x_ticks: list[tuple[float, str]] = field(default_factory=list)
    y_ticks: list[tuple[float, str]] = field(default_factory=list)
    width: int = WIDTH
    height: int = HEIGHT


def _ticks(low: float, high: float, count: int = 4) -> list[float]:
    """About ``count`` round values from ``low`` to ``high``."""
    if high <= low:
        return [low]
    step = 10 ** math.floor(math.log10((high - low) / count))
    for factor in (1, 2, 5, 10):
        if (high - low) / (step * factor) <= count:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _label(value: float) -> str:
    return f"{value:.4g}"


def chart(title: str, metric: str, series: dict[str, list[tuple[int, float]]], colours: dict[str, int]) -> Chart:
    """A line chart of ``series`` (``{run_id: [(iteration, value)]}``), one line per run in its colour."""
    drawn = Chart(title, metric)
    points = [p for values in series.values() for p in values]
    if not points:
        return drawn
    x_low, x_high = min(p[0] for p in points), max(p[0] for p in points)
    y_low, y_high = min(p[1] for p in points), max(p[1] for p in points)
    if y_high == y_low:  # a flat line: a band around it wide enough to stay one at any magnitude
        half = max(0.5, abs(y_low) * 0.01)
        y_low, y_high = y_low - half, y_high + half
    if x_high == x_low:
        x_low, x_high = x_low - 1, x_high + 1
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(value: float) -> float:
        return round(LEFT + (value - x_low) / (x_high - x_low) * inner_w, 1)

    def y(value: float) -> float:
        return round(TOP + (y_high - value) / (y_high - y_low) * inner_h, 1)

    for run_id, values in series.items():
        dots = [(x(i), y(v), f"{run_id} · iteration {i}: {_label(v)}") for i, v in values]
        drawn.lines.append(Line(run_id, colours.get(run_id, 0), " ".join(f"{a},{b}" for a, b, _ in dots), dots))
    drawn.x_ticks = [(x(t), str(int(t))) for t in _ticks(x_low, x_high) if float(t).is_integer()]
    drawn.y_ticks = [(y(t), _label(t)) for t in _ticks(y_low, y_high)]
    return drawn


# Tile classes of the grid envs: each symbol of the env's render to the CSS class of its tile.
def _sokoban(symbols: SokobanSymbols) -> dict[str, str]:
    return {
        symbols.wall: "wall",
        symbols.floor: "floor",
        symbols.target: "target",
        symbols.box: "box",
        symbols.box_on_target: "box-on-target",
        symbols.player: "player",
        symbols.player_on_target: "player-on-target",
    }


FROZEN_LAKE_TILES = {
    FROZEN_LAKE["player"]: "player",
    FROZEN_LAKE["frozen"]: "ice",
    FROZEN_LAKE["hole"]: "hole",
    FROZEN_LAKE["goal"]: "goal",
    FROZEN_LAKE["player_in_hole"]: "player-in-hole",
    FROZEN_LAKE["player_on_goal"]: "player-on-goal",
}


def tiles_of(env: str) -> dict[str, str] | None:
    """The tile classes of an env's grid by its registered name (None: the env draws no grid)."""
    if env.startswith("sokoban_new_vocab"):
        return _sokoban(NEW_VOCAB_SYMBOLS)
    if env.startswith("sokoban"):
        return _sokoban(CLASSIC_SYMBOLS)
    if env.startswith("frozen_lake"):
        return FROZEN_LAKE_TILES
    return None


def grid(env: str, observation: str | None) -> list[list[tuple[str, str]]] | None:
    """The env's state in ``observation`` as rows of ``(symbol, tile class)``: the longest block of two or more
    consecutive lines of one length made only of the env's symbols; None when the env draws no grid or the
    observation holds none."""
    tiles = tiles_of(env)
    if tiles is None or not observation:
        return None
    best: list[str] = []
    block: list[str] = []
    for line in [*observation.splitlines(), ""]:
        line = line.strip()
        if line and set(line) <= tiles.keys() and (not block or len(line) == len(block[0])):
            block.append(line)
            continue
        if len(block) >= 2 and len(block) > len(best):
            best = block
        block = [line] if line and set(line) <= tiles.keys() else []
    if not best:
        return None
    return [[(symbol, tiles[symbol]) for symbol in line] for line in best]
