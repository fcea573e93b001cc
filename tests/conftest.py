"""Shared fixtures: quiet, offline, single-process settings; the tiny model built once per session."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# One torch thread in this process and in every command it starts: the tests run a tiny model, where a second OpenMP
# thread gains nothing, and on two cores shared with the commands and Prefect servers the tests start, threads that
# spin at OpenMP barriers made in-process runs 2-3x slower (measured: a one-iteration flow 7 s vs 13-23 s).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The process workers the tests start (the session's, and those a test starts itself) ask for scheduled runs every
# second, not every 10 s (Prefect's default): each deployment run then starts at once, not 5 s later on average.
os.environ.setdefault("PREFECT_WORKER_QUERY_SECONDS", "1")
# Every process the session starts carries this mark (xdist's workers inherit it from the controller, and every
# command and server they start from them): at the end, a vLLM rollout server still alive with it is an orphan.
os.environ.setdefault("RAGEN_TEST_SESSION", f"{os.getpid()}")

import pytest  # noqa: E402

from ragen_core.config import TinyModelConfig  # noqa: E402

SERVER_FIXTURES = ("prefect_server", "whole_bandit_run")  # the session's `ragen server`, and the run made on it
SERVER_SCOPE = "prefect-server"
# The markers `make test-quick` leaves out (QUICK_MARKERS in the Makefile): a test with none of them must start no
# `ragen` command, which :func:`pytest_runtest_protocol` holds (a test reached through ``request.getfixturevalue``
# is not marked by the fixtures it reaches: its file or test says what it starts).
NOT_QUICK = ("server", "prefect", "process", "slow", "vllm", "gpu", "browser", "s3")
_RUNNING: list[pytest.Item] = []  # the test whose setup, call or teardown runs now
# Markers a test gets from the fixtures it uses (pyproject.toml describes them; `make test-quick` leaves them out):
# what it stands on says what it costs, so no list of test files has to follow the tests.
FIXTURE_MARKERS = {
    **{name: "server" for name in SERVER_FIXTURES},
    "prefect_harness": "prefect",  # Prefect's test harness: a temporary Prefect server, flows run in this process
    "browser": "browser",  # a headless Chromium (tests/view/conftest.py)
    "s3_server": "s3",  # the S3-compatible test server (tests/s3_env.py)
}
_CPU = pytest.StashKey[tuple]()  # the CPU inventory's sampler and the moment it started (RAGEN_TEST_CPU)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without xdist (a lent GPU machine's image) pytest skips it
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN201 - xdist's scheduler type
    """``make test`` (``-n 2 --dist loadfile``): whole files per worker, except that every file using the session's
    `ragen server` runs in one worker, which then starts that server (and its reference run) once instead of each
    worker starting its own (a server and its worker process cost ~150 CPU-s). A file uses it when its source names
    one of :data:`SERVER_FIXTURES`. (``--dist loadgroup`` cannot do this under pytest 9: xdist 3.8 renames node ids
    through an attribute pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    tests = Path(__file__).resolve().parent
    server_files = {
        path.relative_to(tests.parent).as_posix()
        for path in tests.rglob("test_*.py")
        if any(name in path.read_text() for name in SERVER_FIXTURES)
    }

    class ServerFilesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return SERVER_SCOPE if file in server_files else file

        def _assign_work_unit(self, node) -> None:  # noqa: ANN001 - xdist's WorkerController
            # the server's files are the longest unit by far (886 of 2,292 test-seconds on 2026-11-30): first, not
            # last, so the other worker's files fill the time beside them instead of one worker finishing alone
            if SERVER_SCOPE in self.workqueue:
                self.workqueue.move_to_end(SERVER_SCOPE, last=False)
            super()._assign_work_unit(node)

    return ServerFilesTogether(config, log)


@pytest.fixture(scope="session", autouse=True)
def ragen_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test run's own cache folder (the ready Prefect database of ragen_cli/prefect_template.py): the first server
    of the run migrates a fresh database, the later ones start from its copy; the user's cache is left alone. Under
    xdist the workers share one folder (beside their own temporary folders; the template is written atomically)."""
    base = tmp_path_factory.getbasetemp()
    folder = base.parent / "ragen-cache" if os.environ.get("PYTEST_XDIST_WORKER") else base / "ragen-cache"
    folder.mkdir(exist_ok=True)
    os.environ["RAGEN_CACHE_DIR"] = str(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def trusted_test_folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's temporary folders, where its tests build models beside their data roots, are folders the user
    trusts (``RAGEN_TRUSTED_PATHS``): a run trained with ``model.path=<tiny model>`` resumes and is evaluated as a
    user's run from their own model store does. tests/flows/test_config_trust.py clears it to check the refusals."""
    from ragen_core.config.trust import TRUSTED_PATHS_VARIABLE

    base = tmp_path_factory.getbasetemp()
    folder = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    os.environ[TRUSTED_PATHS_VARIABLE] = str(folder)
    return folder


@pytest.fixture(autouse=True)
def no_stop_left_recorded():
    """A test leaves no stop recorded in its worker (:mod:`ragen_core.stops`): every later query of the worker would
    take it for a Ctrl-C. A test that records one isolates the record (monkeypatch) or clears it."""
    from ragen_core import stops

    yield
    if stops.requested():
        stops.clear()
        pytest.fail("the test left a stop recorded in ragen_core.stops (isolate it with monkeypatch or clear it)")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default tiny model, built once for the whole session."""
    from ragen_core.policy import ensure_tiny_model

    return ensure_tiny_model(TinyModelConfig(), tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_policy(tiny_model_dir: Path):
    """(model, tokenizer) of the tiny model; tests must not train this shared instance."""
    from ragen_core.policy import load_policy

    return load_policy(tiny_model_dir)


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory):
    """A temporary Prefect server and database for flow tests, in the place of the temporary server a command starts
    for itself: flow runs send it no heartbeats, as they send none to a command's own (ragen_cli.launch._heartbeats:
    each flow run would wait up to a second at its end for Prefect's heartbeat thread)."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect_home"))
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real Prefect server on a free loopback port with the work pool, prefect.yaml deployed and a process worker,
    started like users start it (`ragen server start`); stopped by PID at the end of the session.

    Yields (state, env, state_dir): ``env`` is the environment for commands that talk to it."""
    from ragen_cli.local_server import alive, base_env, start, stop

    state_dir = tmp_path_factory.mktemp("prefect-local")
    state = start(port=0, state_dir=state_dir, timeout=300)
    env = base_env(Path(state.home), state.api_url)
    for name in ("PREFECT_LOGGING_LEVEL", "RAGEN_FAULT"):  # base_env already drops any launcher rendezvous
        env.pop(name, None)
    yield state, env, state_dir
    stop(state_dir)
    assert not alive(state.server_pid), "the Prefect server outlived `stop`"
    assert not (state.worker_pid and alive(state.worker_pid)), "the worker outlived `stop`"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test marked by the fixtures it uses, directly or through others (:data:`FIXTURE_MARKERS`)."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for marker in sorted({FIXTURE_MARKERS[name] for name in used & FIXTURE_MARKERS.keys()}):
            item.add_marker(marker)


def _ragen_command(args: object) -> bool:
    """Whether the argument list (or shell line) of a new process starts a `ragen` command."""
    if isinstance(args, (str, bytes, os.PathLike)):
        args = os.fsdecode(args).split()[:1]
    argv = [os.fsdecode(a) if isinstance(a, (str, bytes, os.PathLike)) else "" for a in list(args)[:3]]
    return bool(argv) and (Path(argv[0]).name == "ragen" or argv[1:3] == ["-m", "ragen_cli"])


def _guard_commands() -> None:
    """Refuse a `ragen` command started by a test that ``make test-quick`` would run (none of :data:`NOT_QUICK`)."""
    import subprocess

    start = subprocess.Popen.__init__

    def checked(self, args, *rest, **options):  # noqa: ANN001, ANN202 - subprocess.Popen's own signature
        item = _RUNNING[-1] if _RUNNING else None
        if item is not None and _ragen_command(args) and not any(item.get_closest_marker(m) for m in NOT_QUICK):
            raise AssertionError(
                f"{item.nodeid} starts a `ragen` command but carries none of the markers {', '.join(NOT_QUICK)}: "
                "mark it `process` (its file's pytestmark, or the test), so that `make test-quick` leaves it out"
            )
        start(self, args, *rest, **options)

    subprocess.Popen.__init__ = checked


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201 - a hook wrapper
    _RUNNING.append(item)
    try:
        return (yield)
    finally:
        _RUNNING.pop()


def pytest_configure(config: pytest.Config) -> None:
    """Every process refuses a `ragen` command from a test `make test-quick` runs (:func:`_guard_commands`).
    ``RAGEN_TEST_CPU=1``: the controller counts the CPU of every process the run starts (tests/cpu_inventory.py)
    and prints where it went at the end; another value is a path for every process as JSON as well."""
    from tests import cpu_inventory

    _guard_commands()
    wanted = os.environ.get(cpu_inventory.VARIABLE)
    if not wanted or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    config.stash[_CPU] = (cpu_inventory.Sampler(os.environ["RAGEN_TEST_SESSION"]).start(), time.monotonic())


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    if _CPU not in config.stash:
        return
    import resource

    from tests import cpu_inventory

    sampler, started = config.stash[_CPU]
    seen = sampler.stop()
    own = resource.getrusage(resource.RUSAGE_SELF)  # this process's environment lacks the mark: counted here
    argv = [sys.executable, "-m", "pytest"]
    seen.append(cpu_inventory.Seen(os.getpid(), argv, None, own.ru_utime + own.ru_stime))
    lines = cpu_inventory.summary(seen, time.monotonic() - started, os.cpu_count() or 1)
    terminalreporter.section("CPU by process kind")
    for line in lines:
        terminalreporter.write_line(line)
    target = os.environ[cpu_inventory.VARIABLE]
    if target != "1":
        cpu_inventory.write(seen, Path(target))
        terminalreporter.write_line(f"every process: {target}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No vLLM rollout server outlives the tests: one still alive with this session's mark fails the session (it is
    killed, and named)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller checks once, after every worker finished
    import signal
    import time

    from tests.vllm_env import session_servers

    deadline = time.monotonic() + 15  # a server whose trainer just died stops within a second or two
    while (left := session_servers(os.environ["RAGEN_TEST_SESSION"])) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        for pid, _ in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        session.exitstatus = 1
        lines = "\n".join(f"  pid {pid}: {command}" for pid, command in left)
        print(f"\nvLLM rollout servers left running by the tests (killed now):\n{lines}")


@pytest.fixture(scope="module")
def other_host(tmp_path_factory, tiny_model_dir):
    """docs/cluster.md's `ragen rollout serve` as another host runs it (tests.vllm_env.OtherHost), ready; stopped
    with the module."""
    from tests.vllm_env import OtherHost, free_port, require_vllm_python

    require_vllm_python()
    host = OtherHost(tmp_path_factory.mktemp("other-host"), tiny_model_dir, free_port()).start()
    yield host
    host.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-compatible server (tests.s3_env.S3Server: moto's server mode on 127.0.0.1), for the session."""
    from tests.s3_env import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3-server")).start()
    yield server
    server.stop()


@pytest.fixture
def s3_root(s3_server, monkeypatch, tmp_path):
    """A data root in a fresh bucket of the test S3 server: (the s3:// URL, the server); this process and the
    commands it starts reach the store through the standard AWS variables, and keep their local copies in
    ``tmp_path``."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RAGEN_OBJECT_CACHE", str(tmp_path / "object-cache"))
    return f"s3://{s3_server.bucket()}/lake", s3_server
