"""Where a test run's CPU goes, by the kind of process that spent it (``RAGEN_TEST_CPU=1 make test``).

The suite is bound by the CPU on two cores (docs/development.md, "Where the suite's time goes"), so its wall time is
the CPU its processes spend, over the cores. The test durations say which test waited; this says which processes
worked: the tests' own code in the pytest workers, each ``ragen`` command a test starts, Prefect servers, the
flow-run processes of deployments, sampler processes, launched update ranks. A thread of the controller looks at the
machine's processes twice a second (psutil, as tests/vllm_env.py finds a session's servers) and keeps, for every one
that carries the session's mark (``RAGEN_TEST_SESSION``, which every process the tests start inherits), its last CPU
time; a process is seen from its first sample to its last, so one that lives under half a second may be missed and
each loses under half a second at its end.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

VARIABLE = "RAGEN_TEST_CPU"  # "1": print the table at the end; another value: also write every process there (JSON)


@dataclass
class Seen:
    """One process of the run: its command line, the test that started it (or None) and its CPU seconds so far."""

    pid: int
    argv: list[str]
    test: str | None
    cpu: float


def kind(argv: list[str]) -> str:
    """The row a process is counted in, from its command line."""
    line = " ".join(argv)
    if "exec(eval(sys.stdin.readline()))" in line:
        return "pytest workers (the tests' own code)"
    if "pytest" in argv[1:3] or any(a.endswith("pytest/__main__.py") for a in argv[:2]):
        return "pytest controller (and this count)"
    if "uvicorn" in line and "prefect" in line:
        return "Prefect servers"
    if any(a.endswith("/ragen") for a in argv[:2]) or "ragen_cli.main" in line or "ragen_cli/main.py" in line:
        return "ragen commands"
    if "prefect.engine" in line or "prefect/engine.py" in line:
        return "Prefect flow-run processes (deployments)"
    if "prefect" in line:
        return "Prefect CLI and workers"
    if "coverage run" in line or ("launch.py" in line and "code-" in line):
        return "re-stamp probe commands"
    if "ragen_core.rollout.sampler" in line or "ragen_core.run.learner" in line or "run/learner.py" in line:
        return "sampler and learner processes"
    if "ragen_core.training.worker" in line or "torch.distributed.run" in line or "deepspeed" in line:
        return "launched update ranks"
    if "vllm" in line:
        return "vLLM servers"
    if "chrom" in line:
        return "browser"
    return "other processes"


def command(argv: list[str]) -> str:
    """A ``ragen`` command's subcommand (``train``, ``resume``, ...), the first argument after the program."""
    for index, arg in enumerate(argv):
        if arg.endswith("/ragen") or arg in ("ragen_cli.main",) or arg.endswith("ragen_cli/main.py"):
            rest = [a for a in argv[index + 1 :] if not a.startswith("-")]
            return rest[0] if rest else "?"
    return "?"


def summary(seen: list[Seen], wall: float, cores: int) -> list[str]:
    """The table: CPU seconds and share by kind (the ragen commands split by subcommand), then the files whose tests
    started the most of it. ``wall`` and ``cores`` give the share of the machine the run used."""
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    commands: dict[str, float] = defaultdict(float)
    files: dict[str, float] = defaultdict(float)
    for process in seen:
        row = kind(process.argv)
        by_kind[row][0] += process.cpu
        by_kind[row][1] += 1
        if row == "ragen commands":
            commands[command(process.argv)] += process.cpu
        if process.test and not row.startswith("pytest"):
            files[process.test.split("::", 1)[0]] += process.cpu
    total = sum(cpu for cpu, _ in by_kind.values()) or 1.0
    lines = [
        f"CPU of the run: {total:,.0f} s in {len(seen)} processes over {wall:,.0f} s on {cores} cores "
        f"({total / (wall * cores):.0%} of them busy with the run's processes)"
    ]
    for row, (cpu, count) in sorted(by_kind.items(), key=lambda item: -item[1][0]):
        lines.append(f"  {cpu:8,.0f} s {cpu / total:4.0%}  {count:4d}  {row}")
        if row == "ragen commands":
            split = ", ".join(f"{name} {cpu:,.0f}" for name, cpu in sorted(commands.items(), key=lambda c: -c[1]))
            lines.append(f"{'':22}{split}")
    lines.append(
        "  processes started by the tests of each file (CPU s; the largest 12; a server a session fixture starts"
    )
    lines.append("  counts for the file of the first test that needed it, with every request it then serves):")
    for file, cpu in sorted(files.items(), key=lambda item: -item[1])[:12]:
        lines.append(f"  {cpu:8,.0f} s  {file}")
    return lines


class Sampler:
    """The thread that looks at every process (psutil) every ``every`` seconds until :meth:`stop`."""

    def __init__(self, session_mark: str, every: float = 0.5) -> None:
        self.mark = session_mark
        self.every = every
        self.seen: dict[tuple[int, float], Seen] = {}
        self._skip: set[tuple[int, float]] = set()  # processes without the mark, by (pid, start)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-cpu-inventory", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> list[Seen]:
        self._done.set()
        self._thread.join()
        self.sample()  # the processes still alive, once more
        return list(self.seen.values())

    def _run(self) -> None:
        while not self._done.wait(self.every):
            self.sample()

    def sample(self) -> None:
        for process in psutil.process_iter(["cmdline", "cpu_times", "create_time"]):
            info = process.info
            if info["cpu_times"] is None or info["create_time"] is None:
                continue  # gone, or not ours to read
            key = (process.pid, info["create_time"])
            cpu = info["cpu_times"].user + info["cpu_times"].system
            argv = info["cmdline"] or []
            if key in self.seen:  # its command line again: one read between fork and exec shows the parent's
                self.seen[key].cpu = cpu
                self.seen[key].argv = argv or self.seen[key].argv
                continue
            if key in self._skip or not argv:  # no command line: a process about to exit, looked at again next time
                continue
            try:
                environ = process.environ()
            except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            if environ.get("RAGEN_TEST_SESSION") != self.mark:
                self._skip.add(key)
                continue
            self.seen[key] = Seen(process.pid, argv, environ.get("PYTEST_CURRENT_TEST"), cpu)


def write(seen: list[Seen], path: Path) -> None:
    """Every process of the run as JSON (pid, argv, test, cpu), for a closer look than the table."""
    path.write_text(json.dumps([asdict(process) for process in seen], indent=0) + "\n")
