"""A LoRA run's checkpoints read back as a policy: its adapters on its start model. ``ragen eval`` samples with them,
``ragen retrain --init run:RUN@N`` trains them on (or, without ``actor.lora``, the merged model), ``ragen export
--model`` copies them with a README whose PEFT snippet runs, and ``--merge`` writes the merged model. Which weights
sampled a stored row is checked against models built by ``transformers`` and ``peft`` themselves: the stored
behaviour log-probs are those of the adapted model, not of the base."""

from __future__ import annotations

import contextlib
import io
import re

import pytest
import torch
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.storage import DataLake, query

RUN = "lora"
LORA = {"rank": 4, "alpha": 32}
SMALL = {
    "env": {"val_envs": ["bandit"]},
    "rollout": {"env_groups": 2, "group_size": 4, "max_new_tokens": 6},
    "actor": {"mini_batch_size": 8, "micro_batch_size": 4, "lr": 0.05},
    "trainer": {"iterations": 2, "checkpoint_every": 1},
    "eval": {"every": 1, "instances": 2},
}


def _config(tiny_model_dir, lora: dict | None = LORA) -> dict:
    config = {**SMALL, "model": {"path": str(tiny_model_dir)}}
    config["actor"] = {**SMALL["actor"], "lora": lora}
    return config


@pytest.fixture(scope="module")
def root(prefect_harness, tmp_path_factory, tiny_model_dir):
    from flows.train import train

    root = tmp_path_factory.mktemp("lora-policy")
    train(_config(tiny_model_dir), data_root=str(root), run_id=RUN)
    return root


def _peft_model(base_dir, adapter):
    """The adapted policy as PEFT's own loader builds it (nothing of ours)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(adapter)).eval()


def _gap(model, rows, temperature: float = 0.5) -> float:
    """The largest |stored behaviour log-prob - ``model``'s log-prob| over the sampled tokens of validation
    ``rows``, computed with plain torch: the log-softmax of the logits before each token, at the validation's
    sampling temperature (``eval.temperature``, 0.5 by default)."""
    gap = 0.0
    for row in rows:
        ids = torch.tensor([row["input_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float() / temperature
            logprobs = torch.log_softmax(logits, dim=-1)
        own = logprobs.gather(1, ids[0, 1:, None])[:, 0]
        mask = torch.tensor(row["loss_mask"][1:], dtype=torch.bool)
        stored = torch.tensor(row["behavior_logprobs"][1:])
        gap = max(gap, float((own[mask] - stored[mask]).abs().max()))
    return gap


def _val_rows(root, run_id, iteration):
    rows = DataLake(root).read_table("trajectories", run_id, iteration).to_pylist()
    return [row for row in rows if row["split"] == "val"]


def test_eval_samples_the_adapters_of_the_checkpoint_on_the_start_model(root, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from flows.evaluate import evaluate

    lake = DataLake(root)
    adapter = lake.checkpoint_dir(RUN, 2) / "adapter"
    result = evaluate(RUN, n=3, data_root=str(root))
    assert result["model"] == f"{RUN}@2"
    manifest = lake.read_manifest(result["run_id"])
    assert manifest.model_dir == str(tiny_model_dir) and manifest.config["model"]["adapter"] == str(adapter)
    assert manifest.config["eval"]["temperature"] == 0.5  # what _gap assumes
    assert manifest.evaluated["adapter"] == str(adapter) and manifest.evaluated["model_dir"] == str(tiny_model_dir)
    assert manifest.config["actor"]["lora"]["rank"] == 4  # the run's own config: its adapters, not merged
    rows = _val_rows(root, result["run_id"], 0)
    assert len(rows) == 3
    assert _gap(_peft_model(tiny_model_dir, adapter), rows) < 1e-4
    assert _gap(AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), rows) > 1e-2  # not the base's
    earlier = evaluate(f"{RUN}@1", n=3, data_root=str(root))
    assert lake.read_manifest(earlier["run_id"]).config["model"]["adapter"] == str(
        adapter.parent.with_name("iteration=1") / "adapter"
    )
    assert (
        _gap(
            _peft_model(tiny_model_dir, lake.checkpoint_dir(RUN, 1) / "adapter"), _val_rows(root, earlier["run_id"], 0)
        )
        < 1e-4
    )


@pytest.mark.parametrize("lora", [LORA, None], ids=["adapters-trained-on", "merged"])
def test_retrain_starts_from_the_adapters_or_their_merged_model(root, tiny_model_dir, lora):
    from flows.retrain import retrain_offline

    lake = DataLake(root)
    adapter = lake.checkpoint_dir(RUN, 2) / "adapter"
    run_id = f"retrain-{'lora' if lora else 'merged'}"
    config = {**_config(tiny_model_dir, lora), "offline": {"epochs": 1}}
    sql = f"SELECT * FROM trajectories WHERE run_id = '{RUN}' AND split = 'train'"
    retrain_offline(config, sql, f"run:{RUN}@2", "sft", str(root), run_id)
    manifest = lake.read_manifest(run_id)
    assert manifest.status == "completed" and manifest.model_dir == str(tiny_model_dir)
    assert manifest.config["model"]["adapter"] == str(adapter)
    assert (manifest.lineage["init_run"], manifest.lineage["init_iteration"]) == (RUN, 2)
    rows = _val_rows(root, run_id, 0)  # the validation before the first epoch: the start policy sampled it
    assert _gap(_peft_model(tiny_model_dir, adapter), rows) < 1e-4
    formats = query(lake, "SELECT format FROM checkpoints WHERE run_id = ? AND format <> 'deepspeed'", params=[run_id])
    assert formats["format"].to_pylist() == (["lora"] if lora else ["hf"])  # trained on, or merged and all trained


def _snippet(readme: str, run_id: str) -> str:
    section = readme.split(f"## Prompting the policy of `{run_id}`", 1)[1]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]


def test_export_copies_the_adapters_and_its_snippet_loads_them_with_peft(root, tmp_path, tiny_model_dir):
    lake = DataLake(root)
    adapter = lake.checkpoint_dir(RUN, 2) / "adapter"
    out = tmp_path / "with-model"
    result = CliRunner().invoke(app, ["export", RUN, "--model", "--out", str(out), "--data-root", str(root)])
    assert result.exit_code == 0, result.output
    copied = out / "models" / RUN
    files = sorted(p.relative_to(adapter) for p in adapter.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(copied) for p in copied.rglob("*") if p.is_file())
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in files}
    assert all((copied / f).read_bytes() == (adapter / f).read_bytes() for f in files)
    readme = (out / "README.md").read_text()
    assert f'base_dir = "{tiny_model_dir}"' in readme
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(_snippet(readme, RUN), namespace)  # as written: transformers + peft, the copy on the start model
    model, ids = namespace["model"], namespace["inputs"]["input_ids"]
    assert type(model).__name__.startswith("PeftModel")
    with torch.no_grad():
        expected = _peft_model(tiny_model_dir, adapter)(input_ids=ids).logits
        assert torch.equal(model(input_ids=ids).logits, expected)


def test_export_merge_writes_the_merged_model(root, tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    lake = DataLake(root)
    adapter = lake.checkpoint_dir(RUN, 2) / "adapter"
    refused = CliRunner().invoke(
        app, ["export", RUN, "--merge", "--out", str(tmp_path / "no"), "--data-root", str(root)]
    )
    assert refused.exit_code != 0 and "give --model with it" in refused.output
    assert not (tmp_path / "no").exists()
    out = tmp_path / "merged"
    args = ["export", RUN, "--model", "--merge", "--out", str(out), "--data-root", str(root)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    copied = out / "models" / RUN
    assert (copied / "config.json").is_file() and not (copied / "adapter_config.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ragen-merge-")]  # its scratch folder removed
    merged = AutoModelForCausalLM.from_pretrained(copied).eval()
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    ids = torch.tensor([[1, 5, 9, 14, 20]])
    with torch.no_grad():
        adapted = _peft_model(tiny_model_dir, adapter)(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()(input_ids=ids).logits
        assert float((merged(input_ids=ids).logits - adapted).abs().max()) < 1e-4
        assert float((base - adapted).abs().max()) > 1e-2  # the adapters moved the model
    readme = (out / "README.md").read_text()
    assert "base_dir" not in _snippet(readme, RUN)  # a whole model: transformers alone loads it


def test_adapters_without_their_run_name_the_model_they_need(root, tmp_path, tiny_model_dir):
    import shutil

    from flows.evaluate import evaluate
    from ragen_core.run.evaluation import EvaluationError

    loose = tmp_path / "loose"
    shutil.copytree(DataLake(root).checkpoint_dir(RUN, 2) / "adapter", loose)
    with pytest.raises(EvaluationError, match="no run of the data root names the model they adapt: .*model.adapter="):
        evaluate(str(loose), n=2, data_root=str(root))
    named = evaluate(str(tiny_model_dir), n=2, data_root=str(root), overrides=[f"model.adapter={loose}"])
    assert _gap(_peft_model(tiny_model_dir, loose), _val_rows(root, named["run_id"], 0)) < 1e-4
