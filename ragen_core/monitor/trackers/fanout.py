"""A run's trackers together: started at the first commit, each committed iteration to each, the plot at the end.

The lake is the source of truth and a tracker only a view of it, so a tracker never stops a run: one that fails to
start or to log is warned of once, in one line, and left out for the rest of the attempt. What each tracker logged
last, and its own run id, are kept in ``runs/<run id>/trackers/state.json``; the next attempt of the run (a resume,
an extension) continues the same tracker runs and first logs, from the ``metrics`` table, the committed iterations
a tracker missed (a failure, a crash between the commit and the tracker, a tracker added on resume).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ragen_core.config import RunConfig
from ragen_core.monitor.reports import escape_controls
from ragen_core.monitor.trackers.base import TRACKERS, RunEnd, Tracker, TrackerRun, flat_params, one_line, run_tags
from ragen_core.storage import DataLake
from ragen_core.storage.files import atomic_write_json

LOGGER = logging.getLogger("ragen.monitor")
STATE_FILE = "state.json"  # in the run's trackers folder, which the layout hands to this package
PLOT_FILE = "collapse-indicators.png"


class RunTrackers:
    """The trackers ``config.monitor.trackers`` names, for one attempt of run ``run_id``. ``sweep_id`` is asked for
    when they start (a sweep's point is recorded once its session is open)."""

    def __init__(
        self, config: RunConfig, lake: DataLake, run_id: str, sweep_id: Callable[[], str | None] = lambda: None
    ) -> None:
        self.config, self.lake, self.run_id, self._sweep_id = config, lake, run_id, sweep_id
        self.names = list(config.monitor.trackers)
        self.live: dict[str, Tracker] | None = None  # None: not started yet
        self.failed: dict[str, str] = {}  # tracker -> the one line its failure was warned with
        self._state: dict[str, dict[str, Any]] = {}

    def log(self, iteration: int, scalars: Mapping[str, float]) -> None:
        """Give every live tracker the committed ``iteration``'s scalars (starting them first, and catching each up
        on the committed iterations it has not logged yet)."""
        if not self.names:
            return
        try:
            if self.live is None:
                self._start()
                self._catch_up(iteration)
            for name in list(self._live()):
                self._log(name, iteration, scalars)
        finally:  # what was logged before a crash (Ctrl-C) inside a tracker is known to the next attempt
            self._save_state()

    def finish(self, status: RunEnd) -> None:
        """End every live tracker run with ``status``, giving those that take it the run's plot; never raises."""
        if not self.live:
            return
        wants_plot = any(TRACKERS.get(name).takes_plot for name in self.live)
        with tempfile.TemporaryDirectory(prefix="ragen-plot-") as scratch:
            plot = self._draw_plot(Path(scratch)) if wants_plot else None
            for name, tracker in list(self.live.items()):
                self._call(name, "finish", lambda t=tracker: t.finish(status, plot))
        self.live = {}
        self._save_state()

    # -- the pieces ---------------------------------------------------------------------------------------------------
    def _live(self) -> dict[str, Tracker]:
        return self.live or {}

    def _start(self) -> None:
        """Open each named tracker with what the run's earlier attempts stored for it."""
        folder = self.lake.trackers_dir(self.run_id)
        self._state = read_state(folder)
        params = flat_params(self.config.to_dict())
        tags = run_tags(self.config, self.run_id, self._sweep_id())
        self.live = {}
        for name in self.names:
            stored = self._state.get(name, {})
            run = TrackerRun(self.run_id, folder, params, tags, self.config.monitor, stored, self.lake)
            tracker = self._call(name, "start", lambda run=run, spec=TRACKERS.get(name): spec.open(run))
            if tracker is not False:
                self.live[name] = tracker
                state = tracker.state()
                same_run = state == {k: v for k, v in stored.items() if k != "logged"}  # else a new tracker run
                self._state[name] = {**state, "logged": stored.get("logged") if same_run else None}
        self._save_state()

    def _catch_up(self, before: int) -> None:
        """Log, from the ``metrics`` table, the committed iterations below ``before`` a live tracker has not logged."""
        logged = {name: self._state.get(name, {}).get("logged") for name in self._live()}
        first = min((-1 if step is None else step) for step in logged.values()) + 1 if logged else before
        missing = [i for i in self.lake.committed_iterations(self.run_id) if first <= i < before]
        if not missing:
            return
        by_iteration = committed_metrics(self.lake, self.run_id, missing)
        for iteration in missing:
            for name in list(self._live()):
                if logged[name] is None or iteration > logged[name]:
                    self._log(name, iteration, by_iteration.get(iteration, {}))

    def _log(self, name: str, iteration: int, scalars: Mapping[str, float]) -> None:
        tracker = self._live()[name]
        if self._call(name, f"iteration {iteration}", lambda: tracker.log(iteration, scalars)) is not False:
            self._state.setdefault(name, {})["logged"] = iteration

    def _call(self, name: str, when: str, action: Callable[[], Any]) -> Any:
        """``action()``; when it raises, warn once, drop the tracker for the rest of the attempt and return False."""
        try:
            result = action()
        except Exception as exc:  # a tracker's failure of any kind must not stop the run: the lake has its data
            self._drop(name, when, exc)
            return False
        return True if result is None else result

    def _drop(self, name: str, when: str, exc: Exception) -> None:
        if self.live is not None:
            self.live.pop(name, None)
        if name in self.failed:
            return
        self.failed[name] = escape_controls(one_line(exc))
        LOGGER.warning(
            "run %s: tracker %s failed (%s: %s); it gets nothing more in this attempt. The metrics table has "
            "every point, and the run's next attempt (a resume) logs the ones it missed",
            self.run_id,
            name,
            when,
            self.failed[name],
        )

    def _draw_plot(self, scratch: Path) -> Path | None:
        """The run's collapse-indicator PNG (``ragen plot``'s figure) in ``scratch``; None, warned, if it fails."""
        from ragen_core.monitor.plots import draw, panel_data

        try:
            figure = draw(panel_data(self.lake, [self.run_id]), [self.run_id])
            path = scratch / PLOT_FILE
            figure.savefig(path, format="png", dpi=100)
        except Exception as exc:  # the plot is a courtesy; the trackers still finish without it
            shown = escape_controls(one_line(exc))
            LOGGER.warning("run %s: the trackers' plot was not drawn (%s)", self.run_id, shown)
            return None
        return path

    def _save_state(self) -> None:
        try:
            atomic_write_json(self.lake.trackers_dir(self.run_id) / STATE_FILE, self._state)
        except OSError as exc:  # the next attempt then catches up from the start: a view, never a failed run
            LOGGER.warning("run %s: tracker state not saved (%s)", self.run_id, escape_controls(one_line(exc)))


def read_state(folder: Path) -> dict[str, dict[str, Any]]:
    """The trackers' stored state (``{tracker: {logged, run ids...}}``); {} when none or unreadable."""
    try:
        state = json.loads((folder / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(state, dict):
        return {}
    return {name: entry for name, entry in state.items() if isinstance(entry, dict)}


def committed_metrics(lake: DataLake, run_id: str, iterations: list[int]) -> dict[int, dict[str, float]]:
    """The ``metrics`` rows of ``iterations`` (committed ones), as ``{iteration: {name: value}}``."""
    wanted = set(iterations)
    rows = lake.read_table("metrics", run_id, columns=["iteration", "name", "value"]).to_pylist()
    by_iteration: dict[int, dict[str, float]] = {}
    for row in rows:
        if row["iteration"] in wanted:
            by_iteration.setdefault(row["iteration"], {})[row["name"]] = row["value"]
    return by_iteration
