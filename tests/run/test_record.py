"""A run's record: the manifest fields of a stopped run (a Ctrl-C, also one that a library turned into another error
while handling it, is ``interrupted``; any other error ``failed``), and the status a run's body leaves behind."""

import signal

from ragen_core.run.record import interrupted, stop_record


def _raised_while_handling_ctrl_c() -> ValueError:
    try:
        try:
            raise KeyboardInterrupt
        except BaseException:
            raise ValueError("Task run is not set")  # noqa: B904 - as Prefect does when a Ctrl-C hits its task set-up
    except ValueError as exc:
        return exc


def test_a_ctrl_c_and_an_error_raised_while_handling_it_are_interruptions():
    assert interrupted(KeyboardInterrupt())
    assert interrupted(_raised_while_handling_ctrl_c())
    cause = ValueError("x")
    cause.__cause__ = KeyboardInterrupt()
    assert interrupted(cause)
    assert not interrupted(ValueError("a plain error"))
    loop = ValueError("loop")
    loop.__context__ = RuntimeError("back")
    loop.__context__.__context__ = loop  # a cycle ends the walk
    assert not interrupted(loop)


def test_stop_record_fields():
    where = {"iteration": 2, "stage": "evaluate"}
    assert stop_record(_raised_while_handling_ctrl_c(), where, [0, 1]) == {
        "status": "interrupted",
        "interrupted_iteration": 2,
        "interrupted_stage": "evaluate",
        "last_committed_iteration": 1,
    }
    assert stop_record(RuntimeError("boom"), where, []) == {
        "status": "failed",
        "error": "RuntimeError: boom",
        "failed_iteration": 2,
        "failed_stage": "evaluate",
        "last_committed_iteration": None,
    }


def test_run_status_records_how_the_body_ended_and_always_closes_the_session(tmp_path, tiny_model_dir, monkeypatch):
    import pytest

    from ragen_core.config import build_config
    from ragen_core.run.record import run_status
    from ragen_core.run.session import open_session
    from ragen_core.storage import DataLake

    lake = DataLake(tmp_path)
    config = build_config({"model": {"path": str(tiny_model_dir)}})
    session = open_session(config, lake, "life", tiny_model_dir, training=False)
    closed = []
    monkeypatch.setattr(session, "close", lambda: closed.append(True))
    assert lake.read_manifest("life").status == "running"

    with run_status(session):
        pass
    assert lake.read_manifest("life").status == "completed" and closed == [True]

    session.record.position = {"iteration": 4, "stage": "update"}
    with pytest.raises(RuntimeError, match="boom"), run_status(session):
        raise RuntimeError("boom")
    manifest = lake.read_manifest("life")
    assert (manifest.status, manifest.error, manifest.failed_iteration, manifest.failed_stage) == (
        "failed",
        "RuntimeError: boom",
        4,
        "update",
    )
    assert closed == [True, True]

    with pytest.raises(KeyboardInterrupt), run_status(session):
        raise KeyboardInterrupt
    manifest = lake.read_manifest("life")
    assert (manifest.status, manifest.interrupted_stage, manifest.last_committed_iteration) == (
        "interrupted",
        "update",
        None,
    )
    assert closed == [True, True, True]


def test_a_sigterm_raised_as_an_exception_counts_as_an_interruption():
    from ragen_core.run.record import interrupted

    class Termination(BaseException):  # what an orchestration layer raises for a SIGTERM (Prefect's shape)
        def __init__(self, number: int) -> None:
            super().__init__()
            self.signal = number

    class Unrelated(Exception):  # an ordinary error that happens to carry a signal attribute
        def __init__(self) -> None:
            super().__init__()
            self.signal = signal.SIGTERM

    assert interrupted(KeyboardInterrupt()) and interrupted(Termination(signal.SIGTERM))
    assert not interrupted(Termination(signal.SIGUSR1)) and not interrupted(Unrelated())
    try:
        try:
            raise Termination(signal.SIGTERM)
        except Termination:
            raise RuntimeError("clean-up failed on the way out")  # noqa: B904 - the context is what is tested
    except RuntimeError as exc:
        assert interrupted(exc)
