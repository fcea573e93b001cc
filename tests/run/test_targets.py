"""What an evaluation target and an offline ``--init`` resolve to, on a hand-built lake (manifests and checkpoint
folders; no model is loaded): a run's checkpoint, the model a run started from, a folder, and each refusal with
what to do instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragen_core.config import build_config
from ragen_core.run.evaluation import EvaluationError, evaluation_config, evaluation_run_id, resolve_target
from ragen_core.run.offline import OfflineError, StartPolicy, resolve_init
from ragen_core.storage import DataLake
from ragen_core.storage.layout import CHECKPOINT_HF, CHECKPOINT_INFO, checkpoint_file
from schemas.manifest import RunManifest

CONFIG = build_config({}, ["trainer.iterations=4"])
KEEP = (
    "(it saved one every 1 update(s) and kept the newest 2: trainer.checkpoint_every, trainer.keep_last; a run "
    "trained with e.g. trainer.checkpoint_every=10 trainer.keep_last=4 keeps more)"
)  # the defaults, by hand


def _model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder


def _lake(tmp_path: Path) -> tuple[DataLake, Path]:
    """Run ``r`` with checkpoints after 2 and 4 updates, started from ``start/``; run ``early`` stopped before
    choosing its start model; run ``fresh`` without a checkpoint."""
    lake = DataLake(tmp_path / "lake")
    start = _model(tmp_path / "start")
    for run, model_dir in (("r", str(start)), ("early", None), ("fresh", str(start))):
        manifest = RunManifest(run_id=run, config=CONFIG.to_dict(), model_dir=model_dir)
        lake.write_manifest(run, manifest)
    for updates in (2, 4):
        folder = lake.checkpoint_dir("r", updates)
        _model(checkpoint_file(folder, CHECKPOINT_HF))
        checkpoint_file(folder, CHECKPOINT_INFO).write_text("{}")
    return lake, start


def test_a_run_resolves_to_its_newest_checkpoint_or_the_one_named_with_its_config(tmp_path):
    lake, _ = _lake(tmp_path)
    four = checkpoint_file(lake.checkpoint_dir("r", 4), CHECKPOINT_HF)
    model_dir, base, which = resolve_target("r", lake)
    assert (model_dir, which) == (StartPolicy(four), "r@4")
    assert base.tree["trainer"]["iterations"] == 4 and base.source == "runs/r/manifest.json"
    two = StartPolicy(checkpoint_file(lake.checkpoint_dir("r", 2), CHECKPOINT_HF))
    assert resolve_target("r@2", lake)[::2] == (two, "r@2")
    assert resolve_target("run:r@2", lake)[2] == "r@2"


def test_a_folder_resolves_to_itself_or_its_hf_export(tmp_path):
    lake, start = _lake(tmp_path)
    assert resolve_target(str(start), lake) == (StartPolicy(start), None, str(start))
    folder = lake.checkpoint_dir("r", 2)
    assert resolve_target(str(folder), None)[0] == StartPolicy(checkpoint_file(folder, CHECKPOINT_HF))


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("r@3", "run 'r' has no checkpoint after 3 updates; its checkpoints: r@2, r@4 " + KEEP),
        ("r@x", "'r@x': after '@' give the number of updates, e.g. r@10"),
        ("fresh", "run 'fresh' has no checkpoint yet; evaluate the model it started from instead: {start}"),
        ("ghost@2", "no run 'ghost' in {root}; `ragen runs` lists them"),
        ("run:ghost", "no run 'ghost' in {root}; `ragen runs` lists them"),
        ("ghost", "'ghost' is neither a run id in {root} nor a Hugging Face model folder or checkpoint folder"),
    ],
)
def test_an_evaluation_target_that_names_nothing_to_evaluate_says_why(tmp_path, monkeypatch, target, message):
    lake, start = _lake(tmp_path)
    monkeypatch.chdir(tmp_path)  # 'ghost' is looked for as a folder too
    with pytest.raises(EvaluationError) as refused:
        resolve_target(target, lake)
    missing = lake.checkpoint_dir("r", 3)
    assert str(refused.value) == message.format(start=start, root=lake.root, missing=missing)


def test_without_a_data_root_a_target_is_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EvaluationError, match="^no run 'r' in the data root; "):
        resolve_target("r@2", None)
    with pytest.raises(EvaluationError, match="^'r' is neither a run id in the data root nor"):
        resolve_target("r", None)


def test_an_init_run_resolves_to_its_start_model_or_its_checkpoint(tmp_path):
    lake, start = _lake(tmp_path)
    assert resolve_init("run:r", lake) == StartPolicy(start)
    assert resolve_init("run:r@4", lake) == StartPolicy(checkpoint_file(lake.checkpoint_dir("r", 4), CHECKPOINT_HF))
    assert resolve_init(str(start)) == StartPolicy(start) == resolve_init(start)
    assert resolve_init(start).adapter is None


@pytest.mark.parametrize(
    ("init", "message"),
    [
        ("run:r@x", "--init run:r@x: after '@' give the number of updates, e.g. run:r@10"),
        ("run:a/b", "--init run:a/b: 'a/b' is not a run id (letters, digits, '.', '_', '-')"),
        ("run:ghost", "--init run:ghost: no run 'ghost' in {root}"),
        ("run:early", "--init run:early: run 'early' stopped before choosing its start model"),
        ("run:r@3", "--init run:r@3: run 'r' has no checkpoint after 3 updates; its checkpoints: r@2, r@4 " + KEEP),
        ("no\x00where", "--init 'no\\x00where' is not a folder name: it contains a NUL character"),
    ],
)
def test_an_init_that_names_no_model_says_why(tmp_path, init, message):
    lake, _ = _lake(tmp_path)
    with pytest.raises(OfflineError) as refused:
        resolve_init(init, lake)
    missing = lake.checkpoint_dir("r", 3).resolve()  # no checkpoint after 3 updates
    assert str(refused.value) == message.format(root=lake.root, missing=missing)


def test_an_init_run_needs_the_data_root():
    with pytest.raises(OfflineError, match=r"^--init run:<id> needs the data root of that run$"):
        resolve_init("run:r")


def test_the_same_evaluation_names_the_same_run_and_unknown_envs_are_refused():
    config = evaluation_config(CONFIG.to_dict(), ["bandit"], 3)
    assert (config.env.val_envs, config.eval.instances) == (["bandit"], 3)
    assert evaluation_config(CONFIG.to_dict(), None, None).eval.instances == CONFIG.eval.instances
    first = evaluation_run_id("/models/My model é", config)
    assert first == evaluation_run_id("/models/My model é", config)  # same target and config: same run
    assert first.startswith("evaluate-My-model-") and len(first) == len("evaluate-My-model-") + 8  # ASCII, trimmed
    assert evaluation_run_id("/models/other", config) != evaluation_run_id("/models/My model é", config)
    with pytest.raises(EvaluationError, match=r"^--env: unknown environment 'nope'; registered: .*bandit"):
        evaluation_config(None, ["nope"], None)
    with pytest.raises(EvaluationError, match=r"^--env: cannot import module 'no_such_envs_4711'"):
        evaluation_config(None, ["no_such_envs_4711:Env"], None)


def test_an_evaluation_id_holds_no_split_word_and_an_old_one_is_still_found(tmp_path):
    config = evaluation_config(CONFIG.to_dict(), ["bandit"], 3)
    digest = evaluation_run_id("/models/my-test-model", config).rsplit("-", 1)[1]
    # the target's name holds 'test' between separators: written short, and the prefix is no split word either
    assert evaluation_run_id("/models/my-test-model", config) == f"evaluate-my-tst-model-{digest}"
    lake = DataLake(tmp_path)
    assert evaluation_run_id("/models/my-test-model", config, lake) == f"evaluate-my-tst-model-{digest}"
    lake.write_manifest(f"eval-my-test-model-{digest}", RunManifest(run_id=f"eval-my-test-model-{digest}"))
    # an evaluation stored under the name ids had before: the same evaluation finds it (and reuses it)
    assert evaluation_run_id("/models/my-test-model", config, lake) == f"eval-my-test-model-{digest}"
