"""LoRA adapters (actor.lora) on real DeepSpeed engines of the tiny model: only the adapters train, the policy starts
as its base, the KL reference is the adapters off, the update projects only the trained columns, and a checkpoint
holds the adapters alone and resumes bitwise."""

import copy
import inspect
import json
import re

import pytest
import torch
from safetensors.torch import load_file

from ragen_core.algos import grpo_advantage
from ragen_core.config import ActorConfig, AlgorithmConfig, LoraConfig, build_config
from ragen_core.policy import PolicyLoadError
from ragen_core.policy.lora import adapter_names
from ragen_core.storage.lake import DataLake
from ragen_core.training import ActorEngine, OptimConfig
from ragen_core.training.batch import trained_columns
from ragen_core.training.checkpoint import (
    ENGINE_TAG,
    INFO_FILE,
    CheckpointError,
    load_checkpoint,
    read_checkpoint_info,
    save_checkpoint,
)
from ragen_core.training.checkpoint_files import tree_digests
from ragen_core.training.engines import start_engines
from ragen_core.training.starpo import starpo_update
from ragen_core.update.advantages import trajectory_token_rewards
from ragen_core.update.inputs import UpdateInputs
from tests.training.dp_update_script import fixed_batch

RUN = "run-lora"
OPTIM = OptimConfig(lr=1e-2, weight_decay=0.01, grad_clip=1.0, micro_batch_size=4)
ALGORITHM = AlgorithmConfig(
    policy_loss="ppo", clip_low=0.2, clip_high=0.28, kl_coef=0.0, entropy_coef=0.001, loss_agg_mode="token-mean"
)
SCHEDULE = ActorConfig(mini_batch_size=4, ppo_epochs=1)
LORA = LoraConfig(rank=4)


@pytest.fixture(scope="module")
def update_batch(tiny_policy):
    return fixed_batch(tiny_policy[1].pad_token_id)


def _lora_actor(model: torch.nn.Module, lora: LoraConfig = LORA) -> ActorEngine:
    return ActorEngine(copy.deepcopy(model), OPTIM, lora=lora, lora_seed=5)


def _train(update_batch, actor: ActorEngine, seed: int) -> dict[str, float]:
    batch, scores, groups = update_batch
    advantages, _ = grpo_advantage(trajectory_token_rewards(batch.loss_mask, scores), batch.loss_mask, groups)
    return actor.policy_update(batch, advantages, actor.score(batch), ALGORITHM, SCHEDULE, shuffle_seed=seed)


def _base_name(name: str) -> str:
    """The start model's name of a frozen parameter of the PEFT wrap."""
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    pairs = list(zip(a.state_dict().items(), b.state_dict().items(), strict=True))
    return all(name_a == name_b and torch.equal(x, y) for (name_a, x), (name_b, y) in pairs)


def test_only_the_adapter_is_trainable_and_in_the_optimizer(tiny_policy, update_batch):
    start = tiny_policy[0]
    actor = _lora_actor(start)
    trainable = [name for name, p in actor.module.named_parameters() if p.requires_grad]
    assert trainable and trainable == adapter_names(actor.module)
    assert all("lora_" in name for name in trainable)
    in_optimizer = [p for group in actor.engine.optimizer.param_groups for p in group["params"]]
    assert [id(p) for p in in_optimizer] == [id(p) for p in actor.module.parameters() if p.requires_grad]

    _train(update_batch, actor, seed=1)
    originals = start.state_dict()
    frozen = [(n, p) for n, p in actor.module.named_parameters() if not p.requires_grad]
    assert len(frozen) == len(list(start.parameters()))
    assert all(torch.equal(p, originals[_base_name(n)]) for n, p in frozen)
    moved = [p for n, p in actor.module.named_parameters() if "lora_B" in n]
    assert moved and all(p.abs().sum() > 0 for p in moved)  # B starts at 0: every adapter took a step


def test_full_fine_tuning_optimizes_every_parameter_in_order(tiny_policy):
    actor = ActorEngine(copy.deepcopy(tiny_policy[0]), OPTIM)
    assert not actor.adapter and actor.base_digest is None
    in_optimizer = [p for group in actor.engine.optimizer.param_groups for p in group["params"]]
    assert [id(p) for p in in_optimizer] == [id(p) for p in actor.module.parameters()]


def test_lora_starts_as_the_base_and_its_reference_is_the_adapter_off(tiny_model_dir, tiny_policy, update_batch):
    batch, scores, groups = update_batch
    overrides = ["algorithm.kl_coef=0.1", "algorithm.kl_estimator=k3", "actor.lora.rank=4", "actor.lr=0.01"]
    config = build_config(overrides=[*overrides, "actor.mini_batch_size=4", "actor.micro_batch_size=4"])
    actor, critic, _ = start_engines(config, tiny_model_dir, "fp32")
    assert actor.adapter and actor.reference is None and critic is None  # no second copy of the model
    plain = copy.deepcopy(tiny_policy[0]).eval()
    assert torch.equal(actor.score(batch), actor.score(batch, plain))  # B = 0: the policy starts as its base

    metrics = starpo_update(config, actor, None, UpdateInputs(batch, scores, groups), 0)
    assert metrics["actor/kl_loss"] > 0  # the second step's policy has moved off the reference
    assert torch.equal(actor.reference_logprobs(batch), actor.score(batch, plain))
    assert not torch.equal(actor.score(batch), actor.score(batch, plain))


def test_lora_update_projects_only_trained_columns(tiny_policy, update_batch):
    batch = update_batch[0]
    actor = _lora_actor(tiny_policy[0])
    assert "logits_to_keep" not in inspect.signature(actor.module.forward).parameters  # PEFT's own forward hides it
    assert actor.keeps_logits
    columns = trained_columns(batch.loss_mask)
    with torch.no_grad():
        out = actor.module(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=columns - 1)
    assert out.logits.shape[1] == len(columns) < batch.input_ids.shape[1]


def test_a_target_module_that_names_no_linear_layer_is_refused(tiny_policy):
    with pytest.raises(PolicyLoadError, match=r"actor.lora.target_modules: 'qproj' names no linear layer .*q_proj"):
        _lora_actor(tiny_policy[0], LoraConfig(rank=2, target_modules=["q_proj", "qproj"]))
    actor = _lora_actor(tiny_policy[0], LoraConfig(rank=2, target_modules=["q_proj", "v_proj"]))
    assert {name.split(".")[-4] for name in adapter_names(actor.module)} == {"q_proj", "v_proj"}


def _rewrite_actor_state(path, change) -> None:
    """Change the saved actor module state and record the new digests (what someone who can rewrite
    checkpoint.json as well could do): only the load's own checks stand."""
    state_file = path / "actor" / ENGINE_TAG / "mp_rank_00_model_states.pt"
    state = torch.load(state_file, weights_only=False)
    change(state["module"])
    torch.save(state, state_file)
    info = read_checkpoint_info(path)
    info["files"] = tree_digests(path, skip=(INFO_FILE,))
    (path / INFO_FILE).write_text(json.dumps(info))


def test_lora_resume_from_a_checkpoint_is_bitwise_identical(tmp_path, tiny_policy, update_batch):
    from peft import PeftModel

    start, tokenizer = tiny_policy
    actor = _lora_actor(start)
    _train(update_batch, actor, seed=1)
    path = save_checkpoint(DataLake(tmp_path), RUN, 1, actor, None, tokenizer, {"config_hash": "abc"})
    _train(update_batch, actor, seed=2)

    assert not (path / "hf").exists()
    files = {p.name for p in (path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer_config.json"} <= files
    saved = torch.load(path / "actor" / ENGINE_TAG / "mp_rank_00_model_states.pt", weights_only=False)
    assert list(saved["module"]) == adapter_names(actor.module)  # no frozen weight, not even the tied head
    info = read_checkpoint_info(path)
    assert info["lora"]["rank"] == 4 and "model.layers.0.mlp.down_proj" in info["lora"]["target_modules"]
    assert info["versions"]["peft"] == "0.21.2" and len(info["base_model"]["sha256"]) == 64

    resumed = _lora_actor(start)
    load_checkpoint(path, resumed)
    batch = update_batch[0]
    exported = PeftModel.from_pretrained(copy.deepcopy(start), str(path / "adapter")).eval()
    assert torch.equal(resumed.score(batch, exported), resumed.score(batch))
    assert len(load_file(path / "adapter" / "adapter_model.safetensors")) == len(adapter_names(actor.module))
    _train(update_batch, resumed, seed=2)
    assert _same_state(actor.module, resumed.module)
    assert resumed.engine.global_steps == actor.engine.global_steps == 4

    other_base = copy.deepcopy(start)
    with torch.no_grad():
        next(other_base.parameters()).add_(1e-3)
    with pytest.raises(CheckpointError, match="trained on another base model"):
        load_checkpoint(path, _lora_actor(other_base))
    with pytest.raises(CheckpointError, match="holds adapters"):
        load_checkpoint(path, _lora_actor(start, LoraConfig(rank=2)))
    with pytest.raises(CheckpointError, match="holds LoRA adapters but was loaded into a full fine-tuning engine"):
        load_checkpoint(path, ActorEngine(copy.deepcopy(start), OPTIM))

    dropped = adapter_names(actor.module)[3]
    _rewrite_actor_state(path, lambda module: module.pop(dropped))
    with pytest.raises(CheckpointError, match=f"lacks 1 tensors of the adapters \\(e.g. {dropped}\\)"):
        load_checkpoint(path, _lora_actor(start))


def test_a_full_checkpoint_is_refused_by_a_lora_engine(tmp_path, tiny_policy):
    start, tokenizer = tiny_policy
    path = save_checkpoint(DataLake(tmp_path), RUN, 1, ActorEngine(copy.deepcopy(start), OPTIM), None, tokenizer, {})
    assert "lora" not in read_checkpoint_info(path)
    with pytest.raises(CheckpointError, match="holds a fully fine-tuned policy but was loaded into a LoRA engine"):
        load_checkpoint(path, _lora_actor(start))


def _saved_adapter(tmp_path, tiny_policy, update_batch):
    """A trained LoRA actor's checkpoint, its adapter folder and the batch's log-probs under PEFT's own load of it."""
    from peft import PeftModel

    start, tokenizer = tiny_policy
    actor = _lora_actor(start)
    _train(update_batch, actor, seed=1)
    path = save_checkpoint(DataLake(tmp_path), RUN, 1, actor, None, tokenizer, {})
    peft_model = PeftModel.from_pretrained(copy.deepcopy(start), str(path / "adapter")).eval()
    return path / "adapter", actor.score(update_batch[0], peft_model)


def test_an_adapter_folder_starts_the_trained_adapters_or_is_merged(
    tmp_path, tiny_model_dir, tiny_policy, update_batch
):
    adapter, expected = _saved_adapter(tmp_path, tiny_policy, update_batch)
    batch = update_batch[0]
    base = [f"model.adapter={json.dumps(str(adapter))}", "actor.mini_batch_size=4", "actor.micro_batch_size=4"]
    trained_on, _, _ = start_engines(build_config(overrides=[*base, "actor.lora.rank=4"]), tiny_model_dir, "fp32")
    mask = batch.loss_mask.bool()  # the scored columns (the rest are not computed by the engine's own passes)
    assert torch.equal(trained_on.score(batch)[mask], expected[mask])  # the adapters' own weights, unmerged: bitwise
    assert trained_on.adapter and all(
        ".lora_" in n for n, p in trained_on.module.named_parameters() if p.requires_grad
    )
    merged, _, _ = start_engines(build_config(overrides=base), tiny_model_dir, "fp32")
    assert not merged.adapter and not adapter_names(merged.module)  # a plain model, every weight trained
    assert all(p.requires_grad for p in merged.module.parameters())
    gap = float((merged.score(batch) - expected)[mask].abs().max())
    plain = float((ActorEngine(copy.deepcopy(tiny_policy[0]), OPTIM).score(batch) - expected)[mask].abs().max())
    assert gap < 1e-5 < plain  # W + (alpha / r) B A: the adapted model's outputs up to rounding, not the base's


def test_an_adapter_that_does_not_fit_is_one_line_naming_the_settings(
    tmp_path, tiny_model_dir, tiny_policy, update_batch
):
    adapter, _ = _saved_adapter(tmp_path, tiny_policy, update_batch)
    common = [f"model.adapter={json.dumps(str(adapter))}", "actor.mini_batch_size=4", "actor.micro_batch_size=4"]
    with pytest.raises(PolicyLoadError, match=r"has rank 4 and alpha 16, actor.lora rank 8 .*actor.lora.rank=4"):
        start_engines(build_config(overrides=[*common, "actor.lora.rank=8"]), tiny_model_dir, "fp32")
    narrow = [*common, "actor.lora.rank=4", "actor.lora.target_modules=[q_proj]"]
    with pytest.raises(PolicyLoadError, match=r"holds 24 tensors the model has no adapter for .*target_modules"):
        start_engines(build_config(overrides=narrow), tiny_model_dir, "fp32")
    other = tmp_path / "other-base"
    model, tokenizer = tiny_policy
    changed = copy.deepcopy(model)
    with torch.no_grad():
        next(changed.parameters()).add_(1e-3)
    changed.save_pretrained(other)
    tokenizer.save_pretrained(other)
    with pytest.raises(
        PolicyLoadError, match=r"was trained on another base model \(sha256 of its weights [0-9a-f]{64}"
    ):
        start_engines(build_config(overrides=common), other, "fp32")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda f: (f / "adapter_model.safetensors").unlink(),
            "has no adapter_model.safetensors: name a LoRA adapter",
        ),
        (lambda f: (f / "adapter_config.json").write_text("{"), "adapter_config.json is no LoRA config"),
        (lambda f: (f / "adapter_model.safetensors").write_bytes(b"\0" * 9), "adapter_model.safetensors is damaged"),
        (lambda f: (f / "adapter_config.json").unlink(), "has no adapter_config.json"),
    ],
    ids=["pickled-only", "config-json", "weights", "no-config"],
)
def test_a_damaged_adapter_folder_is_refused_when_the_run_starts(tmp_path, tiny_policy, update_batch, damage, message):
    from ragen_core.config import ConfigError
    from ragen_core.run.checks import check_run_start

    adapter, _ = _saved_adapter(tmp_path, tiny_policy, update_batch)
    damage(adapter)
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_run_start(build_config(overrides=[f"model.adapter={json.dumps(str(adapter))}"]))
