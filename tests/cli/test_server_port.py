"""`ragen server start` refuses a port it cannot own, before starting anything: out of range, or held by another
listener (which would otherwise answer the health check in place of the server it started)."""

import socket

from typer.testing import CliRunner

from ragen_cli.main import app


def _start(port, state_dir):
    return CliRunner().invoke(app, ["server", "start", "--port", str(port), "--state-dir", str(state_dir)])


def test_a_port_held_by_another_listener_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        result = _start(port, tmp_path / "state")
    assert result.exit_code == 2
    assert f"port {port} on 127.0.0.1 is in use" in " ".join(result.output.split())
    assert not (tmp_path / "state").exists() and "Traceback" not in result.output


def test_a_port_out_of_range_is_refused(tmp_path):
    for port in (99999, 65536, -1):
        result = _start(port, tmp_path / "state")
        assert result.exit_code == 2 and "is not a TCP port" in " ".join(result.output.split()), result.output
    assert not (tmp_path / "state").exists()
