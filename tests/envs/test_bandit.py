import numpy as np
import pytest

from ragen_core.envs import make_env, registered_envs


def test_registry_lists_the_bandit_family_and_rejects_unknown_names():
    assert {"bandit", "bandit_test", "bandit_reversed"} <= set(registered_envs())
    with pytest.raises(ValueError, match="registered: .*bandit"):
        make_env("nope")


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("bandit", "Phoenix", "Dragon"),
        ("bandit_test", "Trader", "Librarian"),
        ("bandit_reversed", "Dragon", "Phoenix"),
    ],
)
def test_rewards_and_success(name, low, high):
    env = make_env(name)
    for seed in range(200):
        env.reset(seed)
        _, reward, terminated, truncated, info = env.step(low)
        assert reward == pytest.approx(0.1) and terminated and not truncated
        assert info["success"] is False and info["action_is_valid"]
        env.reset(seed)
        _, reward, _, _, info = env.step(high)
        assert reward in (0.0, 1.0) and info["success"] is True


def test_high_arm_pays_one_quarter_of_the_time():
    env = make_env("bandit")
    payouts = []
    for seed in range(4000):
        env.reset(seed)
        payouts.append(env.step("Dragon")[1])
    # binomial(4000, 0.25): std of the mean = sqrt(0.25*0.75/4000) ~ 0.0068; 4 sigma = 0.027
    assert abs(np.mean(payouts) - 0.25) < 0.027


def test_same_seed_same_instance_and_outcome():
    first, second = make_env("bandit"), make_env("bandit")
    for seed in range(50):
        assert first.reset(seed) == second.reset(seed)
        assert first.action_names == second.action_names
        assert first.step("Dragon")[1] == second.step("Dragon")[1]


def test_arm_order_is_randomised_by_seed():
    env = make_env("bandit")
    orders = []
    for seed in range(400):
        env.reset(seed)
        orders.append(env.action_names[0] == "Phoenix")
    assert 0.4 < np.mean(orders) < 0.6


def test_invalid_action_changes_nothing():
    env = make_env("bandit")
    state, _ = env.reset(1)
    observation, reward, terminated, _, info = env.step("Unicorn")
    assert (observation, reward, terminated, info["action_is_valid"]) == (state, 0.0, False, False)


def test_overrides_reach_the_env():
    env = make_env("bandit", low_reward=0.15)
    env.reset(0)
    assert env.step("Phoenix")[1] == pytest.approx(0.15)
