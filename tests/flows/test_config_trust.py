"""A config stored in the data root never names a program to run (issue 39 item 1), on copies of a real data root
(tests/flows/conftest.py's run ``r``: 3 iterations, checkpoints after 2 and 3 updates, started from the tiny model).

Every key declared ``trusted_only`` (a program, a launcher, a hostfile, a folder outside the data root, a tracking
server, a tracker's project or entity, an env server beyond loopback) is planted in
the run's manifest and refused by ``ragen eval``, ``ragen resume`` and an extension (``resume`` with
``--force-config``) before anything starts, in one line naming the file, the key and how to allow it; a stored sweep
plan naming one is refused when read back, and a sweep resumed over it, and ``ragen retrain --init run:r`` beside it,
never use it. The planted "python" is a script that writes a marker file: the marker never appears. A stored config
whose keys are at their defaults, or whose value the user names again, still runs; and a vLLM server that exits
before listening (a fake "python" the user named) is one line naming the server's log, for train, resume, retrain
and eval (issue 39 item 2).
"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.config import RunConfig
from ragen_core.config.trust import TRUSTED_PATHS_VARIABLE, trusted_keys
from ragen_core.storage import DataLake
from ragen_core.sweep import SweepError, read_sweep
from tests.envs.user_code import unique, write_env_module
from tests.flows.test_resume import RUN, _overrides, _ragen

PLANTED_KEYS = [
    "model.path",
    "model.adapter",
    "env.name",
    "env.val_envs",
    "env.options.data_file",
    "env.options.reward_fn",
    "env.options.wrong_answer_fn",
    "env.remote",
    "env.mcp",
    "rollout.vllm.python",
    "rollout.vllm.servers",
    "trainer.launcher",
    "trainer.rdzv_endpoint",
    "trainer.hostfile",
    "critic.path",
    "monitor.mlflow.tracking_uri",
    "monitor.wandb.project",
    "monitor.wandb.entity",
]
SMALL = [
    "eval.instances=2",
    "rollout.env_groups=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=8",
    "actor.mini_batch_size=4",
    "actor.micro_batch_size=4",
    "trainer.num_threads=1",
    "bootstrap.enabled=false",
    "env.val_envs=[bandit]",
]


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def world(whole_bandit_run, tiny_model_dir, tmp_path, monkeypatch):
    """A copy of the real data root, an evil script inside it that writes ``marker`` if it ever runs, the planted
    values of every trusted-only key, and the user's model store (the tiny model's folder) as their only trusted
    folder."""
    root = tmp_path / "root"
    shutil.copytree(whole_bandit_run, root, symlinks=True)
    marker = tmp_path / "marker"
    evil = _script(root / "models" / "evil.sh", f"touch {marker}\nexit 1")
    hosts = root / "models" / "hosts"
    hosts.write_text("evil.example slots=1\n")
    outside = tmp_path / "elsewhere" / "model"
    outside.mkdir(parents=True)
    planted = unique("planted_envs")  # a module on the import path that writes the marker if it is ever imported
    write_env_module(tmp_path / "importable", planted, marker)
    monkeypatch.syspath_prepend(str(tmp_path / "importable"))
    monkeypatch.setenv(TRUSTED_PATHS_VARIABLE, str(tiny_model_dir))
    for name in ("RAGEN_VLLM_PYTHON", "MLFLOW_TRACKING_URI", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    plants = {
        "model.path": {"model.path": str(outside)},
        "env.name": {"env.name": f"{planted}:CoinEnv"},
        "env.val_envs": {"env.val_envs": [f"{planted}:CoinEnv"]},
        "env.options.data_file": {"env.options.data_file": str(outside / "secrets.jsonl")},
        "env.options.reward_fn": {"env.options.reward_fn": f"{planted}:CoinEnv"},
        "env.options.wrong_answer_fn": {"env.options.wrong_answer_fn": f"{planted}:CoinEnv"},
        "env.remote": {"env.remote": "http://evil.example:8000"},  # a host beyond this machine's loopback
        "env.mcp": {"env.mcp": {"command": [str(evil)], "env": {}, "pass_env": [], "cwd": None}},  # a program to start
        "rollout.vllm.python": {"rollout.backend": "vllm", "rollout.vllm.python": str(evil)},
        "rollout.vllm.servers": {  # a rollout server on another host: the run would send it its token
            "rollout.backend": "vllm",
            "rollout.vllm.servers": ["local", "http://evil.example:8000"],
            "rollout.vllm.shards": 2,
        },
        "trainer.launcher": {"trainer.launcher": "torchrun"},
        "trainer.hostfile": {"trainer.launcher": "deepspeed", "trainer.hostfile": str(hosts), "actor.zero_stage": 1},
        "trainer.rdzv_endpoint": {  # where the update group's nodes meet: another host's port
            "trainer.launcher": "torchrun",
            "trainer.nnodes": 2,
            "trainer.rdzv_endpoint": "evil.example:29400",
            "actor.zero_stage": 1,
        },
        "critic.path": {"critic.path": str(outside)},
        "model.adapter": {"model.adapter": str(outside)},
        "monitor.mlflow.tracking_uri": {"monitor.mlflow.tracking_uri": "http://evil.example:5000"},
        "monitor.wandb.project": {"monitor.wandb.project": "evil-project"},
        "monitor.wandb.entity": {"monitor.wandb.entity": "evil-team"},
    }
    return {"root": root, "marker": marker, "evil": evil, "plants": plants, "outside": outside}


def _set(tree: dict, values: dict) -> dict:
    for dotted, value in values.items():
        node = tree
        *sections, key = dotted.split(".")
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    return tree


def _plant_manifest(root: Path, values: dict) -> bytes:
    path = root / "runs" / RUN / "manifest.json"
    manifest = json.loads(path.read_text())
    _set(manifest["config"], values)
    path.write_text(json.dumps(manifest))
    return path.read_bytes()


def _cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def _one_line_refusal(result, *expected: str) -> str:
    """Exit status 2, nothing on stdout, exactly one ``error:`` line on stderr holding ``expected``."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for piece in expected:
        assert piece in lines[0], (piece, lines[0])
    return lines[0]


def test_every_key_that_names_a_program_or_an_outside_folder_is_declared():
    """The audit, as data: these are the keys of the config that name a program, a launcher, hosts or a folder."""
    assert [k.key for k in trusted_keys(RunConfig)] == PLANTED_KEYS
    from ragen_core.rollout.vllm_local import VLLM_ENV_VARIABLE

    assert {k.key: k.env for k in trusted_keys(RunConfig)}["rollout.vllm.python"] == VLLM_ENV_VARIABLE


@pytest.mark.parametrize("key", PLANTED_KEYS)
@pytest.mark.parametrize(
    "command",
    [
        ["eval", RUN, "--n", "2"],
        ["eval", f"run:{RUN}@2", "--n", "2"],
        ["resume", RUN],
        ["resume", RUN, "trainer.iterations=4", "--force-config", "trainer.iterations"],  # an extension
    ],
    ids=["eval", "eval-ref", "resume", "extend"],
)
def test_a_planted_key_is_refused_before_anything_starts(world, key, command):
    root = world["root"]
    manifest = _plant_manifest(root, world["plants"][key])
    if key == "model.adapter" and command[0] == "eval":
        _an_evaluation_never_reads_the_stored_adapter(world, command, manifest)
        return
    launchers = {"trainer.hostfile": "deepspeed", "trainer.rdzv_endpoint": "torchrun"}
    named = [f"trainer.launcher={launchers[key]}"] if key in launchers else []  # the launcher named, not the hosts
    before = sorted(p.relative_to(root) for p in (root / "runs").iterdir())
    result = _cli(*command, *named, "--data-root", root)
    value = dict(world["plants"][key])[key]
    line = _one_line_refusal(result, f"runs/{RUN}/manifest.json sets {key}={value!r}", "again")
    assert "does not name" in line and line.split("; ", 1)[1].split(": pass ", 1)[1].lstrip("'").startswith(f"{key}=")
    assert not world["marker"].exists()
    assert (root / "runs" / RUN / "manifest.json").read_bytes() == manifest  # nothing recorded, nothing started
    assert sorted(p.relative_to(root) for p in (root / "runs").iterdir()) == before


def test_trust_env_module_allows_the_stored_modules_and_nothing_else(world):
    """``--trust-env-module`` lets the stored config's modules be imported (here one that is missing: the import is
    tried, and said in one line naming what the manifest recorded), never its programs or outside folders."""
    root = world["root"]
    _plant_manifest(root, {"env.name": "absent_envs_4711:CoinEnv"})
    for command in (["resume", RUN], ["eval", RUN, "--n", "2"]):
        line = _one_line_refusal(
            _cli(*command, "--trust-env-module", "--data-root", root),
            "env.name: cannot import module 'absent_envs_4711'",
        )
        assert "Traceback" not in line and "does not name" not in line
    _plant_manifest(root, {"env.name": "bandit", **world["plants"]["trainer.launcher"]})
    _one_line_refusal(
        _cli("resume", RUN, "--trust-env-module", "--data-root", root),
        "sets trainer.launcher='torchrun'",
        "does not name a launcher",
    )
    assert not world["marker"].exists()


def test_the_environment_or_a_trusted_folder_allows_a_stored_value_only_when_it_names_the_same(world, monkeypatch):
    root = world["root"]
    _plant_manifest(root, world["plants"]["rollout.vllm.python"])
    monkeypatch.setenv("RAGEN_VLLM_PYTHON", str(world["evil"]) + "-other")
    _one_line_refusal(_cli("eval", RUN, "--n", "2", "--data-root", root), "rollout.vllm.python", "RAGEN_VLLM_PYTHON")
    # a folder inside the data root is no outside folder, but a link inside it that points out is
    _plant_manifest(root, {"rollout.backend": "hf", "rollout.vllm.python": None, "model.path": str(root / "models")})
    link = root / "models" / "linked"
    link.symlink_to(world["outside"])
    _plant_manifest(root, {"model.path": str(link)})
    _one_line_refusal(_cli("resume", RUN, "--data-root", root), "model.path", TRUSTED_PATHS_VARIABLE)
    monkeypatch.setenv(TRUSTED_PATHS_VARIABLE, str(world["outside"].parent))
    # now trusted: the refusal is no longer about the folder (the run then refuses the changed start model itself)
    result = _cli("resume", RUN, "--data-root", root)
    assert "does not name" not in result.stderr, result.stderr
    assert not world["marker"].exists()


def test_a_resume_reads_no_outside_start_model_from_a_manifest(world):
    """The manifest's ``model_dir`` (where a resume's engines start from) is data-root text too: planted outside the
    root, it is refused before anything starts, even with the config untouched."""
    root = world["root"]
    path = root / "runs" / RUN / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["model_dir"] = str(world["outside"])
    path.write_text(json.dumps(manifest))
    result = _cli("resume", RUN, "trainer.iterations=4", "--force-config", "trainer.iterations", "--data-root", root)
    line = _one_line_refusal(result, f"runs/{RUN}/manifest.json names the start model", str(world["outside"]))
    assert TRUSTED_PATHS_VARIABLE in line and json.loads(path.read_text()) == manifest


def test_retrain_init_run_reads_no_outside_start_model_from_a_manifest(world, tiny_model_dir, monkeypatch):
    monkeypatch.delenv(TRUSTED_PATHS_VARIABLE)
    root = world["root"]
    args = [
        "retrain",
        "--from",
        f"SELECT * FROM trajectories WHERE run_id = '{RUN}'",
        "--init",
        f"run:{RUN}",
        "--run-id",
        "again",
        "--data-root",
        root,
    ]
    line = _one_line_refusal(_cli(*args), f"runs/{RUN}/manifest.json names the start model", "--init")
    assert str(tiny_model_dir) in line and not (root / "runs" / "again").exists()


@pytest.mark.parametrize("key", PLANTED_KEYS)
def test_a_stored_sweep_plan_naming_a_program_is_refused_when_read_back(world, key):
    from ragen_core.sweep import plan_sweep, record_sweep

    lake = DataLake(world["root"])
    plan = plan_sweep(RunConfig(), [], seeds=2, sweep_id="sw")
    path = record_sweep(lake, plan)
    assert read_sweep(lake, "sw") == plan  # the benign plan reads back as it was
    stored = json.loads(path.read_text())
    _set(stored["points"][1]["config"], world["plants"][key])
    path.write_text(json.dumps(stored))
    # hosts come with their launcher, which is checked first
    named = "trainer.launcher" if key in ("trainer.hostfile", "trainer.rdzv_endpoint") else key
    with pytest.raises(SweepError, match=rf"^sweeps/sw\.json sets {named}=.*does not name .*pass '?{named}="):
        read_sweep(lake, "sw")


# -- real commands: a benign stored config still runs; the planted one is never used --------------------------------


def test_a_benign_stored_config_and_a_value_named_again_still_run(world, tiny_model_dir, prefect_server, monkeypatch):
    root, api_url = world["root"], prefect_server[0].api_url
    rc, output = _ragen(["eval", RUN, "--n", "2", "--run-id", "benign-eval"], root, None, api_url)
    assert rc == 0, output[-3000:]
    monkeypatch.delenv(TRUSTED_PATHS_VARIABLE)  # the model store no longer trusted: named again, it is the user's
    extend = ["resume", RUN, "trainer.iterations=4", "--force-config", "trainer.iterations"]
    # refused before anything starts (the refusals above run in this process too: no command process needed)
    _one_line_refusal(_cli(*extend, "--data-root", root), "sets model.path=", "pass model.path=")
    rc, output = _ragen([*extend, f"model.path={tiny_model_dir}"], root, None, api_url)
    assert rc == 0 and "resumed at iteration 3" in output, output[-3000:]
    assert max(DataLake(root).committed_iterations(RUN)) == 4  # 3 (the final validation) trained, 4 validated


def _an_evaluation_never_reads_the_stored_adapter(world, command, manifest: bytes) -> None:
    """An evaluation evaluates its target's policy: the stored run's model.adapter (merged into the start model of
    that run, so already in its checkpoints) is replaced by the target's own adapters, here none; nothing from
    outside the data root is read, and the request builds."""
    from ragen_core.run.inputs import EvalInputs
    from ragen_core.run.requests import eval_request

    root = world["root"]
    request = eval_request(EvalInputs(target=command[1], data_root=root, n=2))
    assert request.config.model.adapter is None and "adapter" not in request.config.hashed_tree()["model"]
    assert (root / "runs" / RUN / "manifest.json").read_bytes() == manifest and not world["marker"].exists()


def test_retrain_and_a_resumed_sweep_never_use_a_planted_program(world, tiny_model_dir, prefect_server):
    root, api_url, marker = world["root"], prefect_server[0].api_url, world["marker"]
    everything = {k: v for plant in world["plants"].values() for k, v in plant.items() if k != "model.path"}
    _plant_manifest(root, everything)
    retrain = [
        "retrain",
        "--from",
        f"SELECT * FROM trajectories WHERE run_id = '{RUN}' AND iteration = 0",
        "--init",
        f"run:{RUN}",
        "--run-id",
        "offline",
        "--config",
        "configs/bandit.yaml",
        *SMALL,
        "offline.epochs=1",
    ]
    rc, output = _ragen(retrain, root, None, api_url)
    assert rc == 0, output[-3000:]
    config = DataLake(root).read_manifest("offline").config
    assert config["rollout"]["vllm"]["python"] is None and config["trainer"]["launcher"] == "inprocess"
    sweep = [
        "sweep",
        "--config",
        "configs/bandit.yaml",
        *SMALL,
        f"model.path={tiny_model_dir}",
        "trainer.iterations=1",
        "--sweep-id",
        "sw",
    ]
    rc, output = _ragen(sweep, root, None, api_url)
    assert rc == 0, output[-3000:]
    plan = root / "sweeps" / "sw.json"
    stored = json.loads(plan.read_text())
    _set(stored["points"][0]["config"], everything)
    plan.write_text(json.dumps(stored))
    point = root / "runs" / "sw-p000" / "manifest.json"
    manifest = json.loads(point.read_text())
    _set(manifest["config"], everything)
    point.write_text(json.dumps(manifest))
    rc, output = _ragen(sweep, root, None, api_url)  # the same command again: the sweep resumed over the stored plan
    assert rc in (0, 1) and "Traceback" not in output, output[-3000:]
    assert not marker.exists()


# -- a vLLM server that exits before listening: one line naming its log (issue 39 item 2) ----------------------------


def test_a_server_that_exits_before_listening_is_one_line_naming_its_log(
    world, tiny_model_dir, prefect_server, monkeypatch
):
    root, api_url = world["root"], prefect_server[0].api_url
    ran = world["marker"].with_name("fake-ran")
    fake = _script(world["marker"].parent / "fake" / "python", f"touch {ran}\necho 'no vLLM engine here' >&2\nexit 3")
    vllm = ["rollout.backend=vllm"]
    commands = {
        "eval": ["eval", RUN, "--n", "2", *vllm, f"rollout.vllm.python={fake}"],  # named on the command line
        "train": ["train", "--config", "configs/bandit.yaml", "--run-id", "v", *_overrides(tiny_model_dir), *vllm],
        "resume": ["resume", "v"],
        "retrain": [
            "retrain",
            "--from",
            f"SELECT * FROM trajectories WHERE run_id = '{RUN}' AND iteration = 0",
            "--init",
            f"run:{RUN}@2",
            "--run-id",
            "offline-vllm",
            "--config",
            "configs/bandit.yaml",
            *SMALL,
            *vllm,
        ],
    }
    for name, args in commands.items():
        if name != "eval":
            monkeypatch.setenv("RAGEN_VLLM_PYTHON", str(fake))  # named in the environment
        ran.unlink(missing_ok=True)
        rc, output = _ragen(args, root, None, api_url)
        lines = [line for line in output.splitlines() if line.startswith("error:")]
        assert rc == 2 and len(lines) == 1, f"{name}: {output[-3000:]}"
        assert "Traceback" not in output and ran.exists(), f"{name}: {output[-3000:]}"
        assert "exited with status 3 before listening" in lines[0] and "no vLLM engine here" in lines[0], lines[0]
        log = Path(lines[0].split("see its log ", 1)[1].split(" (its last line", 1)[0])
        assert log.name == "server.log" and log.is_file() and log.is_relative_to(root), lines[0]
