"""One model per command's inputs (:mod:`ragen_core.run.inputs`), held to every door: the flow's parameters (a
deployment's form), the API function's arguments and the command line's help say what the model says, by name,
default and description; a value of the wrong kind is one line naming the field; and the checks the command line
alone made before (a data root that is a file or cannot be written, a precision this machine cannot run, a
re-training's start model and selection) are the builder's, so the API refuses them as the command does."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import typer

import ragen_core.api as api
from flows.evaluate import evaluate as evaluate_flow
from flows.retrain import retrain_offline
from flows.train import train as train_flow
from ragen_cli.main import app
from ragen_core.run.inputs import CommandInputs, EvalInputs, ResumeInputs, RetrainInputs, TrainInputs
from ragen_core.run.requests import RequestError, refusals, retrain_request, run_request

REQUIRED = "(required)"
CALLER_HOOKS = {"progress", "step"}  # the API's own: where progress goes, not what the command is


def _parameters(function) -> dict[str, object]:
    signature = inspect.signature(getattr(function, "fn", function))
    return {
        name: (REQUIRED if p.default is inspect.Parameter.empty else p.default)
        for name, p in signature.parameters.items()
        if name not in CALLER_HOOKS
    }


def _fields(model: type[CommandInputs], leave_out: tuple[str, ...] = ()) -> dict[str, object]:
    return {
        name: REQUIRED if field.is_required() else field.default
        for name, field in model.model_fields.items()
        if name not in leave_out
    }


@pytest.mark.parametrize(
    ("door", "model", "leave_out"),
    [
        (train_flow, TrainInputs, ()),
        (retrain_offline, RetrainInputs, ()),
        (evaluate_flow, EvalInputs, ()),
        (api.train, TrainInputs, ("sweep",)),  # a sweep's point is the sweep's to set: api.sweep sets it
        (api.resume, ResumeInputs, ()),
        (api.evaluate, EvalInputs, ()),
        (api.retrain, RetrainInputs, ()),
    ],
    ids=lambda x: getattr(x, "__name__", getattr(x, "name", None)) if not isinstance(x, tuple) else None,
)
def test_every_door_takes_its_command_s_model_by_name_and_default(door, model, leave_out):
    assert _parameters(door) == _fields(model, leave_out)


def _cli_help(command: str) -> dict[str, str]:
    click_command = typer.main.get_command(app).commands[command]
    return {p.name: p.help for p in click_command.params if getattr(p, "help", None)}


def test_the_command_line_s_help_is_the_model_s_description():
    assert _cli_help("train")["run_id"] == TrainInputs.describe("run_id")
    retrain = _cli_help("retrain")
    assert {k: retrain[k] for k in ("sql", "mode", "init", "run_id")} == {
        k: RetrainInputs.describe(k) for k in ("sql", "mode", "init", "run_id")
    }
    assert _cli_help("eval")["n"] == EvalInputs.describe("n")
    assert _cli_help("resume")["skip_iteration"] == ResumeInputs.describe("skip_iteration")


def test_a_value_of_the_wrong_kind_or_an_unknown_field_is_one_line():
    with pytest.raises(RequestError, match=r"^n: Input should be a valid integer.* \(given 'two'\)$"):
        EvalInputs.of(target="m", n="two")
    with pytest.raises(RequestError, match=r"^data_rot: Extra inputs are not permitted \(given 'x'\)$"):
        TrainInputs.of(data_rot="x")
    assert RetrainInputs.of(config=None, sql="SELECT 1", init="m").mode == "sft"
    with pytest.raises(RequestError, match=r"^init: Field required$"):
        RetrainInputs.of(config=None, sql="SELECT 1")


def test_the_builder_refuses_what_only_the_command_line_refused(tmp_path, tiny_model_dir):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(RequestError, match="is a file, not a folder; name a folder as the data root"):
        run_request(TrainInputs.of(data_root=afile, overrides=[f"model.path={tiny_model_dir}"]))
    below_a_file = afile / "lake"
    with pytest.raises(RequestError, match=r"cannot be written \(.*\); name a writable folder as the data root"):
        run_request(TrainInputs.of(data_root=below_a_file, overrides=[f"model.path={tiny_model_dir}"]))
    empty = tmp_path / "empty"
    empty.mkdir()
    sql = "SELECT * FROM trajectories"
    with pytest.raises(refusals()) as refused:
        retrain_request(RetrainInputs.of(config=None, sql=sql, init=str(tmp_path / "no-model"), data_root=empty))
    assert "no-model" in str(refused.value)
    assert sorted(p.name for p in empty.iterdir()) == []  # refused with nothing written
    with pytest.raises(RequestError, match="does not exist; name the data root that holds the trajectories"):
        retrain_request(RetrainInputs.of(config=None, sql=sql, init=str(tiny_model_dir), data_root=tmp_path / "none"))
    assert not Path(tmp_path / "none").exists()
