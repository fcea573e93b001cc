"""What every experiment tracker is: a registered name, the package it needs, and three calls.

A tracker (``monitor.trackers``) is opened with a :class:`TrackerRun` (the run id, its folder, the resolved config
as flat params, the tags, what an earlier attempt of the run stored for it) and then gets, in step order, each
committed iteration's scalars (:meth:`Tracker.log`), and once, at the end, the run's status and plot
(:meth:`Tracker.finish`). :meth:`Tracker.state` is what a later attempt needs to continue the same tracker run (an
MLflow run id, a W&B run id). Trackers import their package only when opened: the name is checked against
:data:`TRACKERS`, and the package found on the path (:func:`check_trackers`), when the config loads.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from ragen_core.config import MonitorConfig, RunConfig
from ragen_core.registry import Registry
from ragen_core.storage import DataLake
from ragen_core.storage.trust import check_real_folders

RunEnd = Literal["completed", "failed", "interrupted"]  # the manifest's status at the end of an attempt
INSTALL_HINT = "pip install 'ragen-flows[{extra}]' (or `make install-trackers`)"


@dataclass(frozen=True)
class TrackerRun:
    """What a tracker is told of the run it follows."""

    run_id: str
    folder: Path  # the run's trackers folder (runs/<run id>/trackers/); each tracker keeps to its own sub-folder
    params: dict[str, Any]  # the resolved config, flattened to dotted keys (JSON values)
    tags: dict[str, str]  # run_id, env, preset, config_hash and, for a sweep's point, sweep
    settings: MonitorConfig
    stored: dict[str, Any]  # what this tracker's state() was at the end of the run's earlier attempt ({}: none)
    lake: DataLake

    def subfolder(self, name: str) -> Path:
        """The tracker's own folder ``folder/name``, checked to be a real folder when it exists (a link planted
        there would lead the tracker's writes out of the data root)."""
        return check_real_folders(self.lake.root, self.folder / name, "tracker folder")


class Tracker(Protocol):
    """An open tracker run."""

    def state(self) -> dict[str, Any]:
        """JSON-able: what a resumed attempt needs to continue this tracker run."""
        ...

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """Record one committed iteration's scalars at ``step`` (= the iteration)."""
        ...

    def finish(self, status: RunEnd, plot: Path | None) -> None:
        """End the tracker run: its status, and the run's collapse-indicator PNG (``plot``) as an artifact."""
        ...


@dataclass(frozen=True)
class TrackerSpec:
    """A registered tracker: how to open it, the package it imports (None: always there) and the extra that installs
    it, and whether it takes the run's plot at the end (drawing it costs a second)."""

    open: Callable[[TrackerRun], Tracker]
    package: str | None = None
    extra: str | None = None
    takes_plot: bool = True


TRACKERS: Registry[TrackerSpec] = Registry("tracker")


def check_trackers(names: Sequence[str]) -> None:
    """Refuse (``ValueError``, one line) an unregistered tracker name or one whose package is not installed, before
    anything runs: the package is looked for on the path, not imported."""
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"monitor.trackers: unknown tracker {name!r}; registered: {', '.join(TRACKERS.names())}")
        spec = TRACKERS.get(name)
        if spec.package and importlib.util.find_spec(spec.package) is None:
            hint = INSTALL_HINT.format(extra=spec.extra or spec.package)
            raise ValueError(
                f"monitor.trackers: {name} needs the {spec.package} package, which is not installed: {hint}; or "
                f"leave {name} out of monitor.trackers"
            )


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: the config as a tracker's params (an empty section gives no key)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flat_params(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run_tags(config: RunConfig, run_id: str, sweep_id: str | None) -> dict[str, str]:
    """The tags every tracker gets: the run id, env, algorithm preset, config hash and, for a sweep's point, the
    sweep id (the tags Prefect's UI shows, plus the run id and hash)."""
    tags = {
        "run_id": run_id,
        "env": config.env.name,
        "preset": config.algorithm.preset,
        "config_hash": config.config_hash(),
    }
    return tags | ({"sweep": sweep_id} if sweep_id else {})


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` of ``exc`` and, when it wraps another error, of the innermost one (a store
    error's own text is often a wrapper's: "raised as a result of Query-invoked autoflush ..."), shortened: what a
    warning says of a tracker's error (a database error's text runs over many lines, with its SQL)."""
    root, seen = exc, {id(exc)}
    while (root.__cause__ or root.__context__) is not None and id(root.__cause__ or root.__context__) not in seen:
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
        seen.add(id(root))
    text = _first_line(exc) + (f" (from {_first_line(root)})" if root is not exc else "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
