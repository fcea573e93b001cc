"""The manifest fields of a stopped run: a Ctrl-C, also one that a library turned into another error while handling
it, is recorded as ``interrupted``; any other error as ``failed``."""

from ragen_core.session import interrupted, stop_record


def _raised_while_handling_ctrl_c() -> ValueError:
    try:
        try:
            raise KeyboardInterrupt
        except BaseException:
            raise ValueError("Task run is not set")  # noqa: B904 - as Prefect does when the Ctrl-C hits its task set-up
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
        "status": "interrupted", "interrupted_iteration": 2, "interrupted_stage": "evaluate",
        "last_committed_iteration": 1}  # fmt: skip
    assert stop_record(RuntimeError("boom"), where, []) == {
        "status": "failed", "error": "RuntimeError: boom", "failed_iteration": 2, "failed_stage": "evaluate",
        "last_committed_iteration": None}  # fmt: skip
