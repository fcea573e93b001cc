import copy
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ragen_core.algos import grpo_advantage
from ragen_core.config import ActorConfig, AlgorithmConfig, CriticConfig
from ragen_core.storage.lake import DataLake, LakeError
from ragen_core.training import ActorEngine, OptimConfig
from ragen_core.training.checkpoint import (
    ENGINE_TAG,
    CheckpointError,
    load_checkpoint,
    read_checkpoint_info,
    save_checkpoint,
)
from ragen_core.training.critic import CriticEngine, ValueModel
from ragen_core.update.advantages import trajectory_token_rewards
from tests.training.dp_update_script import fixed_batch

REPO = Path(__file__).resolve().parents[2]
RUN = "run-a"
OPTIM = OptimConfig(lr=1e-2, weight_decay=0.01, grad_clip=1.0, micro_batch_size=4)
ALGORITHM = AlgorithmConfig(
    policy_loss="ppo", clip_low=0.2, clip_high=0.28, kl_coef=0.0, entropy_coef=0.001, loss_agg_mode="token-mean"
)
SCHEDULE = ActorConfig(mini_batch_size=4, ppo_epochs=1)
CRITIC_SCHEDULE = CriticConfig(cliprange_value=0.5, mini_batch_size=4, ppo_epochs=1)
DISTRIBUTED_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def update_batch(tiny_policy):
    """Eight synthetic one-turn chats in two groups, with scores of both signs of advantage."""
    return fixed_batch(tiny_policy[1].pad_token_id)


def _actor(tiny_policy) -> ActorEngine:
    return ActorEngine(copy.deepcopy(tiny_policy[0]), OPTIM)


def _critic(tiny_policy) -> CriticEngine:
    return CriticEngine(ValueModel.from_policy(tiny_policy[0]), OPTIM)


def _train(update_batch, actor: ActorEngine, critic: CriticEngine | None, seed: int) -> None:
    """One StarPO update of the actor (and the critic) on the fixed batch; ``seed`` shuffles the mini-batches."""
    batch, scores, groups = update_batch
    advantages, _ = grpo_advantage(trajectory_token_rewards(batch.loss_mask, scores), batch.loss_mask, groups)
    actor.policy_update(batch, advantages, actor.score(batch), ALGORITHM, SCHEDULE, shuffle_seed=seed)
    if critic is not None:
        returns = scores[:, None] * batch.loss_mask
        values = critic.values(batch)
        critic.update(batch, values, returns, batch.loss_mask, ALGORITHM, CRITIC_SCHEDULE, shuffle_seed=seed)


def _same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    pairs = list(zip(a.state_dict().items(), b.state_dict().items(), strict=True))
    return all(name_a == name_b and torch.equal(x, y) for (name_a, x), (name_b, y) in pairs)


def _hidden_entries(root: Path) -> list[str]:
    folder = root / "runs" / RUN / "checkpoints"
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_resume_from_a_checkpoint_is_bitwise_identical(tmp_path, tiny_policy, update_batch):
    actor, critic = _actor(tiny_policy), _critic(tiny_policy)
    _train(update_batch, actor, critic, seed=1)
    path = save_checkpoint(DataLake(tmp_path), RUN, 1, actor, critic, tiny_policy[1], {"config_hash": "abc"})
    _train(update_batch, actor, critic, seed=2)

    resumed_actor, resumed_critic = _actor(tiny_policy), _critic(tiny_policy)  # from the original weights
    info = load_checkpoint(path, resumed_actor, resumed_critic)
    assert (info["iteration"], info["run_id"], info["extra"]) == (1, RUN, {"config_hash": "abc"})
    assert resumed_actor.engine.global_steps == info["actor_global_steps"] == 2  # 8 rows / mini-batches of 4
    _train(update_batch, resumed_actor, resumed_critic, seed=2)

    assert _same_parameters(actor.module, resumed_actor.module)
    assert _same_parameters(critic.module, resumed_critic.module)
    assert resumed_actor.engine.global_steps == actor.engine.global_steps == 4

    # the optimizer state matters: the same weights with a fresh AdamW state take a different second update
    weights_only = _actor(tiny_policy)
    weights_only.engine.load_checkpoint(str(path / "actor"), tag=ENGINE_TAG, load_module_only=True)
    _train(update_batch, weights_only, None, seed=2)
    assert not _same_parameters(actor.module, weights_only.module)


def test_hugging_face_export_loads_with_plain_transformers(tmp_path, tiny_policy, update_batch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    actor = _actor(tiny_policy)
    _train(update_batch, actor, None, seed=0)
    path = save_checkpoint(DataLake(tmp_path), RUN, 3, actor, None, tiny_policy[1], {})
    assert path == tmp_path.resolve() / "runs" / RUN / "checkpoints" / "iteration=3"
    # DeepSpeed writes inside the folder it is given only, and no 'latest' file (we pass explicit tags)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and all(path in p.resolve().parents for p in written)
    assert not [p for p in written if p.name == "latest"]
    assert (path / "actor" / ENGINE_TAG / "mp_rank_00_model_states.pt").is_file()
    assert (path / "hf" / "model.safetensors").is_file()
    mask = os.umask(0)
    os.umask(mask)
    assert {p.stat().st_mode & 0o777 for p in (path / "hf").iterdir()} == {0o666 & ~mask}  # shared roots: readable

    model = AutoModelForCausalLM.from_pretrained(path / "hf", local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(path / "hf", local_files_only=True)
    assert _same_parameters(model, actor.module)
    assert not _same_parameters(model, tiny_policy[0])  # the trained weights, not the initial ones
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Go left or right?"}], tokenize=False)
    assert tokenizer(text)["input_ids"] == tiny_policy[1](text)["input_ids"]
    prompt = tokenizer(text, return_tensors="pt")
    greedy = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
    with torch.no_grad():
        exported = model.generate(**prompt, **greedy)
        engine = actor.module.eval().generate(**prompt, **greedy)
    assert exported.shape[1] > prompt["input_ids"].shape[1]
    assert torch.equal(exported, engine)


_CRASHING_SAVE = """
import sys
from ragen_core.policy import load_policy
from ragen_core.storage import DataLake
from ragen_core.training import ActorEngine, OptimConfig
from ragen_core.training.checkpoint import save_checkpoint

model, tokenizer = load_policy(sys.argv[1])
actor = ActorEngine(model, OptimConfig(lr=1e-2, weight_decay=0.0, grad_clip=1.0, micro_batch_size=4))
save_checkpoint(DataLake(sys.argv[2]), sys.argv[3], 2, actor, None, tokenizer, {})
print("SAVED")
"""


@pytest.mark.process  # a save in a process killed midway
def test_a_save_killed_midway_leaves_no_checkpoint(tmp_path, tiny_policy, tiny_model_dir):
    # this process builds an engine first, so DeepSpeed's comm op is compiled before anything is killed
    actor = _actor(tiny_policy)
    save_checkpoint(DataLake(tmp_path), RUN, 1, actor, None, tiny_policy[1], {})
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    env["RAGEN_FAULT"] = "checkpoint:mid_save"
    child = subprocess.run(
        [sys.executable, "-c", _CRASHING_SAVE, str(tiny_model_dir), str(tmp_path), RUN],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert "SAVED" not in child.stdout
    assert [n for n, _ in DataLake(tmp_path).list_checkpoints(RUN)] == [1]
    assert _hidden_entries(tmp_path) == [".tmp-iteration=2"]  # the kill hit after the engine state was written
    leftover = tmp_path / "runs" / RUN / "checkpoints" / ".tmp-iteration=2"
    assert (leftover / "actor" / ENGINE_TAG / "mp_rank_00_model_states.pt").is_file()
    assert not (leftover / "checkpoint.json").exists()

    save_checkpoint(DataLake(tmp_path), RUN, 2, actor, None, tiny_policy[1], {})
    assert [n for n, _ in DataLake(tmp_path).list_checkpoints(RUN)] == [1, 2]
    assert _hidden_entries(tmp_path) == []


def test_listing_latest_and_pruning(tmp_path, tiny_policy):
    actor = _actor(tiny_policy)
    for iteration in (1, 2, 4, 10):
        save_checkpoint(DataLake(tmp_path), RUN, iteration, actor, None, tiny_policy[1], {"v": 1})
    folder = tmp_path / "runs" / RUN / "checkpoints"
    (folder / "iteration=11").mkdir()  # incomplete: no checkpoint.json
    (folder / ".tmp-iteration=12").mkdir()  # a crashed save
    assert [n for n, _ in DataLake(tmp_path).list_checkpoints(RUN)] == [1, 2, 4, 10]  # numeric, not string, order
    assert DataLake(tmp_path).list_checkpoints("other-run") == []
    assert DataLake(tmp_path).latest_checkpoint(RUN) == (10, folder / "iteration=10")
    assert DataLake(tmp_path).latest_checkpoint(RUN, at_most=9) == (4, folder / "iteration=4")
    assert DataLake(tmp_path).latest_checkpoint(RUN, at_most=0) is None

    removed = DataLake(tmp_path).prune_checkpoints(RUN, keep_last=2)
    assert removed == [folder / "iteration=1", folder / "iteration=2"]
    assert not any(p.exists() for p in removed)
    assert [n for n, _ in DataLake(tmp_path).list_checkpoints(RUN)] == [4, 10]
    assert DataLake(tmp_path).prune_checkpoints(RUN, keep_last=2) == []
    with pytest.raises(ValueError, match="keep_last"):
        DataLake(tmp_path).prune_checkpoints(RUN, keep_last=0)

    # saving an iteration again replaces its checkpoint, and cleans the leftovers of the crashed save
    save_checkpoint(DataLake(tmp_path), RUN, 10, actor, None, tiny_policy[1], {"v": 2})
    assert read_checkpoint_info(folder / "iteration=10")["extra"] == {"v": 2}
    assert _hidden_entries(tmp_path) == []


def test_checkpoint_dir_layout(tmp_path):
    expected = tmp_path.resolve() / "runs" / RUN / "checkpoints" / "iteration=7"
    assert DataLake(tmp_path).checkpoint_dir(RUN, 7) == DataLake(str(tmp_path)).checkpoint_dir(RUN, 7) == expected
    assert DataLake(tmp_path).checkpoint_origin(expected / "hf") == (RUN, 7)
    assert DataLake(tmp_path).checkpoint_origin(tmp_path / "runs" / RUN / "elsewhere" / "iteration=7") == (None, None)
    with pytest.raises(ValueError, match=">= 0"):
        DataLake(tmp_path).checkpoint_dir(RUN, -1)
    with pytest.raises(LakeError):
        DataLake(tmp_path).checkpoint_dir("../escape", 7)


def test_loading_an_incomplete_or_mismatched_checkpoint_fails_clearly(tmp_path, tiny_policy):
    actor = _actor(tiny_policy)
    incomplete = DataLake(tmp_path).checkpoint_dir(RUN, 5)
    incomplete.mkdir(parents=True)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(incomplete, actor)

    path = save_checkpoint(DataLake(tmp_path), RUN, 1, actor, None, tiny_policy[1], {"reward": np.float32(0.5)})
    assert read_checkpoint_info(path)["extra"] == {"reward": 0.5}
    with pytest.raises(TypeError, match="JSON-serialisable"):
        save_checkpoint(DataLake(tmp_path), RUN, 2, actor, None, tiny_policy[1], {"bad": object()})
    assert [n for n, _ in DataLake(tmp_path).list_checkpoints(RUN)] == [1]
    assert _hidden_entries(tmp_path) == []  # it failed before writing anything

    with pytest.raises(CheckpointError, match="no critic state"):
        load_checkpoint(path, actor, _critic(tiny_policy))

    for file in (path / "actor" / ENGINE_TAG).iterdir():
        file.unlink()
    with pytest.raises(CheckpointError, match="no actor model state"):
        load_checkpoint(path, actor)
