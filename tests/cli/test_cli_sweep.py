"""`ragen sweep`, `ragen eval` and `ragen server`: bad input is refused with a clear message before any compute."""

from __future__ import annotations

from typer.testing import CliRunner

from ragen_cli.main import app


def _invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env=env)


def test_sweep_refuses_a_bad_point_before_writing_anything(tmp_path):
    result = _invoke("sweep", "--grid", "algorithm.filter_ratio=[0.5,1.5]", "--data-root", str(tmp_path / "lake"))
    assert result.exit_code == 2
    assert "point 1 (algorithm.filter_ratio=1.5) is not a valid config" in result.output
    assert not (tmp_path / "lake").exists()


def test_sweep_refuses_bad_search_syntax(tmp_path):
    result = _invoke("sweep", "--random", "actor.lr=gauss(1,2)", "--samples", "2", "--data-root", str(tmp_path))
    assert result.exit_code == 2 and "dist one of uniform, loguniform, randint, choice" in result.output
    result = _invoke("sweep", "--grid", "algorithm.filter_ratio=[0.5]", "--seeds", "x", "--data-root", str(tmp_path))
    assert result.exit_code == 2 and "give a count (3) or a comma-separated list" in result.output


def test_sweep_through_deployments_needs_a_server(tmp_path):
    result = _invoke(
        "sweep",
        "--grid",
        "algorithm.filter_ratio=[0.5]",
        "--deployment",
        "--data-root",
        str(tmp_path),
        env={"PREFECT_API_URL": None},
    )
    assert result.exit_code == 2 and "make server" in result.output and "PREFECT_API_URL" in result.output


def test_eval_refuses_unknown_targets_envs_and_sizes(tmp_path):
    result = _invoke("eval", "no-such-run", "--data-root", str(tmp_path))
    assert result.exit_code == 2 and "neither a run id" in result.output
    result = _invoke("eval", "x", "--n", "0", "--data-root", str(tmp_path))
    assert result.exit_code == 2 and "n (the validation instances per env) must be at least 1, not 0" in result.output


def test_server_status_and_stop_without_a_server(tmp_path):
    result = _invoke("server", "status", "--state-dir", str(tmp_path))
    assert result.exit_code == 1 and "no server recorded" in result.output
    result = _invoke("server", "stop", "--state-dir", str(tmp_path))
    assert result.exit_code == 0 and "nothing to stop" in result.output


def test_the_worker_environment_drops_a_launchers_rendezvous(monkeypatch, tmp_path):
    from ragen_cli.local_server import base_env

    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "50037", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SOMETHING_ELSE", "kept")
    env = base_env(tmp_path, "http://127.0.0.1:1/api")
    assert not {"RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"} & set(env)
    assert env["SOMETHING_ELSE"] == "kept" and env["PREFECT_API_URL"] == "http://127.0.0.1:1/api"
    assert env["PREFECT_HOME"] == str(tmp_path)
