import pytest
import torch

from ragen_core.algos import value_loss
from ragen_core.config import AlgorithmConfig, CriticConfig
from ragen_core.training import OptimConfig, collate
from ragen_core.training.critic import CriticEngine, ValueModel

ALGORITHM = AlgorithmConfig(loss_agg_mode="token-mean")
SCHEDULE = CriticConfig(cliprange_value=0.5, mini_batch_size=4, ppo_epochs=1)


@pytest.fixture(scope="module")
def chat_batch(tiny_policy):
    """Six synthetic multi-turn chats: prompt (0), turn (1), env text (0), turn (1), of varying lengths."""
    _, tokenizer = tiny_policy
    generator = torch.Generator().manual_seed(0)
    ids, masks = [], []
    for row in range(6):
        prompt, turn1, env, turn2 = 4 + row % 3, 3 + row % 2, 2, 2 + row % 4
        length = prompt + turn1 + env + turn2
        ids.append(torch.randint(10, 300, (length,), generator=generator).tolist())
        masks.append([0] * prompt + [1] * turn1 + [0] * env + [1] * turn2)
    batch = collate(ids, masks, tokenizer.pad_token_id)
    targets = torch.tensor([1.0, -1.0, 0.5, 0.0, 0.8, -0.6])
    returns = targets[:, None] * batch.loss_mask  # (B, T): each chat's score on all its response tokens
    return batch, returns


def _critic(tiny_policy, micro_batch_size: int, lr: float = 1e-2, optimizer: str = "adamw") -> CriticEngine:
    model, _ = tiny_policy
    optim = OptimConfig(lr=lr, weight_decay=0.0, grad_clip=1.0, micro_batch_size=micro_batch_size, optimizer=optimizer)
    return CriticEngine(ValueModel.from_policy(model), optim)


def test_values_shape_mask_and_alignment(tiny_policy, chat_batch):
    batch, _ = chat_batch
    critic = _critic(tiny_policy, micro_batch_size=4)
    values = critic.values(batch)
    assert values.shape == batch.input_ids.shape
    assert bool((values[batch.loss_mask == 0] == 0).all())
    assert bool((values[batch.loss_mask > 0] != 0).all())
    # value at t is read from the hidden state at t - 1 (the state before token t), for the whole batch at once
    module = critic.module.eval()
    with torch.no_grad():
        hidden = module.backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        expected = module.value_head(hidden).squeeze(-1)[:, :-1]
    torch.testing.assert_close(values[:, 1:], expected * batch.loss_mask[:, 1:], rtol=1e-5, atol=1e-6)


def test_from_pretrained_matches_from_policy(tiny_policy, tiny_model_dir, chat_batch):
    batch, _ = chat_batch
    loaded = ValueModel.from_pretrained(tiny_model_dir).eval()
    copied = ValueModel.from_policy(tiny_policy[0]).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(batch.input_ids, batch.attention_mask), copied(batch.input_ids, batch.attention_mask)
        )


def test_updates_fit_fixed_returns(tiny_policy, chat_batch):
    batch, returns = chat_batch
    critic = _critic(tiny_policy, micro_batch_size=3, lr=3e-3)

    def loss_now() -> float:
        values = critic.values(batch)
        return float(value_loss(values, values, returns, batch.loss_mask, cliprange_value=0.5)[0])

    before = loss_now()
    for step in range(12):
        metrics = critic.update(
            batch, critic.values(batch), returns, batch.loss_mask, ALGORITHM, SCHEDULE, shuffle_seed=step
        )
    after = loss_now()
    assert after < 0.1 * before  # observed: 0.26 -> 0.005
    assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm"} <= set(metrics)
    assert metrics["critic/grad_norm"] > 0
    assert 0.0 <= metrics["critic/vf_clipfrac"] <= 1.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batching_does_not_change_the_update(tiny_policy, chat_batch, mode):
    batch, returns = chat_batch
    algorithm = AlgorithmConfig(loss_agg_mode=mode)
    schedule = CriticConfig(cliprange_value=0.5, mini_batch_size=6, ppo_epochs=1)
    whole, split = _critic(tiny_policy, 6, 0.5, "sgd"), _critic(tiny_policy, 4, 0.5, "sgd")
    old = whole.values(batch)
    whole_metrics = whole.update(batch, old, returns, batch.loss_mask, algorithm, schedule, shuffle_seed=0)
    split_metrics = split.update(batch, old, returns, batch.loss_mask, algorithm, schedule, shuffle_seed=0)
    for a, b in zip(whole.module.parameters(), split.module.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert whole_metrics["critic/vf_loss"] == pytest.approx(split_metrics["critic/vf_loss"], rel=1e-5)
