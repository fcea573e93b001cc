"""A model folder never runs its own code: a config with ``auto_map`` (and the module it names, which would leave a
mark if imported) is refused with a clear error before transformers sees it, by every loader and by `ragen eval`."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.policy import PolicyLoadError, load_policy, load_tokenizer
from ragen_core.training.critic import ValueModel

EVIL = """
from pathlib import Path
Path(__file__).with_name("RAN").write_text("the folder's code ran")
"""


def _planted(tiny_model_dir: Path, tmp_path: Path, file: str) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "evil.py").write_text(EVIL)
    config = json.loads((folder / file).read_text()) if (folder / file).is_file() else {}
    config["auto_map"] = {
        "AutoConfig": "evil.EvilConfig",
        "AutoModelForCausalLM": "evil.EvilModel",
        "AutoTokenizer": ["evil.EvilTokenizer", None],
    }
    if file == "config.json":
        config["model_type"] = "evil"
    (folder / file).write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json"])
def test_every_loader_refuses_a_folder_that_declares_its_own_code(tiny_model_dir, tmp_path, file):
    folder = _planted(tiny_model_dir, tmp_path, file)
    for load in (load_policy, load_tokenizer, ValueModel.from_pretrained):
        with pytest.raises(PolicyLoadError, match=rf"declares its own code \({file}: auto_map.*trust_remote_code"):
            load(folder)
    assert not (folder / "RAN").exists()


def test_an_unknown_architecture_is_a_clear_error(tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "no-such-architecture"}))
    with pytest.raises(PolicyLoadError, match="cannot be loaded as a causal LM"):
        load_policy(folder)


@pytest.mark.server  # a ragen eval with its own Prefect server
def test_ragen_eval_refuses_it_in_one_line(tiny_model_dir, tmp_path):
    folder = _planted(tiny_model_dir, tmp_path, "config.json")
    result = CliRunner().invoke(
        app,
        ["eval", str(folder), "--config", "configs/bandit.yaml", "--n", "2", "--data-root", str(tmp_path / "lake")],
        input="y\n",
    )
    assert result.exit_code != 0
    assert "declares its own code" in " ".join(result.output.split())
    assert "Traceback" not in result.output and not (folder / "RAN").exists()
