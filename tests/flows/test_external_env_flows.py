"""An environment of the user's own code through every command (issue 40): a class in a module on PYTHONPATH
(``env.name=<module>:CoinEnv``) and one that an installed distribution registers under the entry-point group
``ragen.envs`` (``env.name=<entry point name>``), each trained, killed and resumed to bitwise the same weights and
rows as the run that never stopped, evaluated and queried with ``ragen sql`` (the module's run also re-trained
offline: ``ragen retrain`` takes the env from its command line as ``ragen train`` does); its manifest records where
the code came from, a stored import path is imported only with ``--trust-env-module`` (an entry-point name needs
nothing: the user installed it), and a resume without the code is one line naming what the run recorded.

The user's code is written into a temporary folder by tests/envs/user_code.py and reaches the commands through
PYTHONPATH; nothing of the project's tree knows it.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from tests.envs.user_code import unique, write_distribution, write_env_module
from tests.flows.test_resume import RUN, _overrides, _ragen, _rows, _weights

FAULT = "update:inside@1"  # killed inside iteration 1's update: the resume replays nothing, redoes the update


def _refused_here(args: list[str], root) -> tuple[int, str]:
    """A command that must be refused before it runs anything, invoked in this process (the CLI's own code, without
    the ~4 s start of a process of its own): (exit status, stdout and stderr). The user's code is not on this
    process's path, so a command that tried to import it would end in another error than the refusal."""
    from typer.testing import CliRunner

    from ragen_cli.main import app

    result = CliRunner().invoke(app, [*args, "--data-root", str(root)])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.stdout + result.stderr


def _one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in output, output[-3000:]
    return lines[0]


@pytest.fixture(scope="module", params=["module", "entry_point"])
def world(request, tmp_path_factory, tiny_model_dir, prefect_server):
    """The user's env on PYTHONPATH; the run that never stopped (``whole``) and the same run killed at
    :data:`FAULT` and resumed (``killed``), with the outputs of the resume refused and the resume allowed."""
    user = tmp_path_factory.mktemp("user")
    if request.param == "module":
        name = write_env_module(user, unique("user_envs"))
        source = {"import_path": name, "distribution": None, "version": None}
    else:
        name, package = unique("coin"), unique("coin_pkg")
        write_distribution(user, "coin-dist", "0.3.1", name, package)
        source = {"import_path": f"{package}:CoinEnv", "distribution": "coin-dist", "version": "0.3.1"}
    patch = pytest.MonkeyPatch()
    patch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(user), os.environ.get("PYTHONPATH")) if p))
    api = prefect_server[0].api_url
    overrides = [o for o in _overrides(tiny_model_dir) if not o.startswith("env.")]
    overrides += [f"env.name={name}", f"env.val_envs=[{name}]"]
    trust = ["--trust-env-module"] if request.param == "module" else []
    whole, killed = tmp_path_factory.mktemp("whole-user-env"), tmp_path_factory.mktemp("killed-user-env")
    train = ["train", "--config", "configs/bandit.yaml", "--run-id", RUN, *overrides]
    rc, output = _ragen(train, whole, None, api)
    assert rc == 0, output[-3000:]
    rc, output = _ragen(train, killed, FAULT, api)
    assert rc == -signal.SIGKILL, output[-3000:]
    plain = _refused_here(["resume", RUN], killed) if trust else None  # refused: nothing runs
    rc, output = _ragen(["resume", RUN, *trust], killed, None, api)
    assert rc == 0 and "resumed at iteration 1" in output, output[-3000:]
    yield {
        "kind": request.param,
        "name": name,
        "source": source,
        "user": user,
        "whole": whole,
        "killed": killed,
        "plain": plain,
        "trust": trust,
        "api": api,
        "overrides": overrides,
    }
    patch.undo()


def test_a_resumed_run_of_the_user_env_is_bitwise_the_run_that_never_stopped(world):
    expected, actual = _weights(world["whole"]), _weights(world["killed"])
    assert expected.keys() == actual.keys() and all(torch.equal(expected[k], actual[k]) for k in expected)
    for table in ("trajectories", "turns", "metrics", "evaluations"):
        assert _rows(world["killed"], table) == _rows(world["whole"], table), table


def test_its_validation_metrics_name_the_env_by_its_class(world):
    from ragen_core.storage import query

    rows = query(world["whole"], "SELECT DISTINCT name FROM metrics WHERE name LIKE 'val/%'").to_pylist()
    names = {r["name"] for r in rows}
    short = "CoinEnv" if world["kind"] == "module" else world["name"]  # an entry point's name is short already
    assert f"val/{short}/success" in names and not any(":" in n for n in names), names


def test_the_manifest_records_the_import_path_and_the_distribution(world):
    from ragen_core.storage import DataLake

    manifest = DataLake(world["killed"]).read_manifest(RUN)
    assert manifest.config["env"]["name"] == world["name"]
    assert manifest.code_sources == {world["name"]: world["source"]}


def test_a_stored_import_path_is_imported_only_when_the_user_allows_it(world):
    if world["kind"] == "entry_point":
        assert world["plain"] is None  # resumed without the flag: an installed distribution's name is harmless
        return
    rc, output = world["plain"]
    line = _one_error_line(output)
    assert rc == 2 and f"runs/{RUN}/manifest.json sets env.name={world['name']!r}" in line
    assert "does not name a module to import" in line and "--trust-env-module" in line
    rc, output = _refused_here(["eval", RUN, "--n", "2", "--run-id", "refused"], world["killed"])
    assert rc == 2 and "--trust-env-module" in _one_error_line(output)
    rc, output = _ragen(
        ["eval", RUN, "--n", "2", f"env.name={world['name']}", f"env.val_envs=[{world['name']}]", "--run-id", "named"],
        world["killed"],
        None,
        world["api"],
    )
    assert rc == 0, output[-3000:]  # named again on the command line: the user's own value


def test_it_is_evaluated_retrained_offline_and_queried(world):
    """Evaluated (the env named by the stored config) and queried with ``ragen sql`` for both kinds; re-trained offline
    for the module kind only: ``ragen retrain`` takes the env from its command line through the same config
    resolution as ``ragen train`` (``resolve_config``), which the world's runs already passed with the entry point's
    name, and its flow builds its validation envs with the builder every run's validation uses. The entry point
    re-trained as well would repeat that code for one more command (~10 s of the suite's critical path)."""
    root, api, name = world["killed"], world["api"], world["name"]
    rc, output = _ragen(["eval", RUN, "--n", "2", "--run-id", "ev", *world["trust"]], root, None, api)
    assert rc == 0, output[-3000:]
    expected = {(RUN, "train"): 3 * 2 * 4, (RUN, "val"): 4 * 2, ("ev", "val"): 2}  # 3 iterations x 2 groups x 4
    if world["kind"] == "module":
        retrain = [
            "retrain",
            "--from",
            f"SELECT * FROM trajectories WHERE run_id = '{RUN}' AND iteration = 0",
            "--init",
            f"run:{RUN}",
            "--run-id",
            "rt",
            "--config",
            "configs/bandit.yaml",
            *world["overrides"],
            "offline.epochs=1",
        ]
        rc, output = _ragen(retrain, root, None, api)
        assert rc == 0, output[-3000:]
        expected[("rt", "val")] = 2 * 2  # validated before and after its one epoch
    query = (
        "SELECT run_id, split, env, count(*) AS n, sum(total_reward) AS reward FROM trajectories "
        "GROUP BY ALL ORDER BY ALL"
    )
    rc, output = _ragen(["sql", query, "--format", "json"], root, None, api)
    assert rc == 0, output
    rows = json.loads(output[output.index("[") :])
    # one row per (run, split) (test_a_stored_import_path_... may have evaluated "named" here first): each count
    # as configured, and every trajectory of every run (the evaluation's included) is of the user's env
    ours = [r for r in rows if r["run_id"] != "named"]
    assert {(r["run_id"], r["split"]): r["n"] for r in ours} == expected and len(ours) == len(expected), rows
    assert {r["env"] for r in rows} == {name}


def test_a_resume_without_the_code_says_so_in_one_line(world):
    hidden = world["user"].with_name(world["user"].name + "-moved")
    world["user"].rename(hidden)
    try:
        rc, output = _ragen(["resume", RUN, *world["trust"]], world["killed"], None, world["api"])
    finally:
        hidden.rename(world["user"])
    line = _one_error_line(output)
    source = world["source"]
    recorded = f"the run recorded {source['import_path']} from " + (
        "distribution coin-dist 0.3.1" if source["distribution"] else "no distribution"
    )
    assert rc == 2 and recorded in line, line
    missing = "cannot import module" if world["kind"] == "module" else f"unknown environment {world['name']!r}"
    assert missing in line, line
