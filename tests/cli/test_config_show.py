"""``ragen config show``: the real command in a subprocess lists every key with the value the file and the overrides
give it, the default and the description its pydantic field declares (read here from the fields, not from the
command's own walk), fails a bad key in one line, and touches no data root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from ragen_core.config import RunConfig

pytestmark = pytest.mark.process  # the real command in a subprocess

PROJECT = Path(__file__).resolve().parents[2]
BANDIT = PROJECT / "configs" / "bandit.yaml"


def _show(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``ragen config show ARGS`` run from an empty folder whose data root does not exist."""
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "RAGEN_DATA_ROOT": str(tmp_path / "root")}
    command = [sys.executable, "-m", "ragen_cli.main", "config", "show", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def _field(dotted: str):
    """The pydantic field of a dotted key, found by walking the annotations of RunConfig's sections."""
    model: type[BaseModel] = RunConfig
    *sections, name = dotted.split(".")
    for section in sections:
        model = model.model_fields[section].annotation
    return model.model_fields[name]


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys |= _leaf_keys(field.annotation, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


@pytest.fixture(scope="module")
def shown(tmp_path_factory) -> tuple[dict[str, dict], Path]:
    tmp_path = tmp_path_factory.mktemp("show")
    result = _show(tmp_path, "--config", str(BANDIT), "--format", "json", "actor.lr=0.0005", "algorithm.preset=starpo")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) == len({row["key"] for row in rows})
    return {row["key"]: row for row in rows}, tmp_path


def test_every_leaf_key_is_listed_with_its_fields_default_and_description(shown):
    rows, _ = shown
    assert set(rows) == _leaf_keys(RunConfig) and len(rows) > 100
    for key in ("actor.weight_decay", "trainer.keep_last", "rollout.vllm.gpu_memory_utilization", "model.tiny.seed"):
        field = _field(key)
        assert rows[key]["default"] == field.default, key
        assert rows[key]["description"] == field.description and field.description, key


def test_values_come_from_the_file_and_the_overrides(shown):
    rows, _ = shown
    assert rows["actor.lr"]["value"] == 0.0005 and rows["actor.lr"]["default"] == _field("actor.lr").default != 0.0005
    bandit = yaml.safe_load(BANDIT.read_text())
    assert rows["trainer.iterations"]["value"] == bandit["trainer"]["iterations"]
    assert (
        rows["trainer.iterations"]["default"]
        == _field("trainer.iterations").default
        != rows["trainer.iterations"]["value"]
    )
    # a key the preset sets defaults to the chosen preset's value (StarPO: no clip-higher)
    starpo = _field("algorithm.clip_high").json_schema_extra["presets"]["starpo"]
    assert rows["algorithm.clip_high"]["default"] == rows["algorithm.clip_high"]["value"] == starpo
    assert rows["algorithm.preset"]["value"] == "starpo" and rows["algorithm.preset"]["default"] == "starpo_s"


def test_no_data_root_is_read_or_written(shown):
    _, tmp_path = shown
    assert list(tmp_path.iterdir()) == []


def test_the_table_shows_a_key_its_value_and_its_description(tmp_path):
    result = _show(tmp_path, "trainer.keep_last=7")
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if " trainer.keep_last " in line)
    cells = [cell.strip() for cell in line.strip("│ ").split("│")]
    assert cells[:3] == ["trainer.keep_last", "7", str(_field("trainer.keep_last").default)]
    assert _field("trainer.keep_last").description.startswith(cells[3])


@pytest.mark.parametrize(
    ("override", "named"),
    [("algorithm.nope=1", "algorithm.nope"), ("actor.lr=fast", "actor.lr"), ("trainer.iterations", "key.sub=value")],
)
def test_a_bad_key_or_value_is_one_line_and_exit_status_2(tmp_path, override, named):
    result = _show(tmp_path, override)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and named in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    if override.startswith("algorithm.nope"):
        assert "`ragen config show` lists every key" in lines[0]
    assert list(tmp_path.iterdir()) == []
