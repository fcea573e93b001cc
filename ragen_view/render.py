"""What the pages draw, as plain data for the templates (which escape every text): line charts as SVG coordinates,
and an env's state as a board of tiles where the env declares how its grid is drawn (its ``grid_legend``: Sokoban,
FrozenLake, any registered env that has one). Nothing here names an env."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ragen_core.envs import make_env, registered_envs
from ragen_core.envs.base import Tile

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


@dataclass(frozen=True)
class Cell:
    """One cell of a drawn board: the symbol read from the observation, its tile (the env's legend: name, colour,
    label) and the ink its symbol is written in on that colour."""

    symbol: str
    tile: Tile
    ink: str


def legend_of(env: str) -> tuple[Tile, ...]:
    """The tile legend (:attr:`TextEnv.grid_legend`) of the env this project registers as ``env``, built by name with
    its default options; () when it draws no grid or cannot be built without options. An env of the user's own code
    (an import path, an installed distribution's entry point) is never imported by the viewer (docs/security.md):
    () too, and its states are shown as text."""
    if env not in registered_envs():
        return ()
    try:
        return tuple(make_env(env).grid_legend)
    except ValueError:  # an env that needs its options (a data file, say) to be built: no board
        return ()


def ink(colour: str) -> str:
    """The colour a symbol is readable in on a tile of ``colour`` (``#rrggbb``): near-black on a light tile, white on
    a dark one (WCAG's relative luminance, over its usual threshold)."""
    channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return "#111111" if luminance > 0.179 else "#ffffff"


def grid(legend: Sequence[Tile], observation: str | None) -> list[list[Cell]] | None:
    """The env's state in ``observation`` as rows of cells drawn by ``legend``: the longest block of two or more
    consecutive lines of one length made only of the legend's symbols; None when the legend is empty (the env draws
    no grid) or the observation holds none."""
    tiles = {tile.symbol: tile for tile in legend}
    if not tiles or not observation:
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
    return [[Cell(symbol, tiles[symbol], ink(tiles[symbol].colour)) for symbol in line] for line in best]
