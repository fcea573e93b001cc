"""``rollout.prompt_style=compact`` and the ``describe_random`` scripted policy: the prompts written out by hand
from an independent replay of the env, the thinking checked against the rendered grid; the bootstrap's cache key."""

from pathlib import Path

import pytest

from ragen_core.agent import ChatFormatter
from ragen_core.envs import make_env
from ragen_core.lineage import lineage_root
from ragen_core.registry import Registry
from ragen_core.rollout import RolloutSpec, ScriptedBackend, run_rollouts, scripted
from ragen_core.run.bootstrap import bootstrap_key
from ragen_core.run.checks import load_run_config as load_config
from tests.envs.test_frozen_lake import _goal_from_render

HEADER = "<|im_start|>user\n"
ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n<think>"


def _spec(mode="full", window=None):
    return RolloutSpec(
        "frozen_lake",
        [3, 4, 5],
        2,
        max_turns=6,
        max_actions_per_turn=1,
        max_actions_per_traj=6,
        context_window_mode=mode,
        max_context_window=window,
    )


def _shown(record):
    """(state, actions left) each turn's prompt showed, and the reward of the turn before, by replaying the actions."""
    env = make_env("frozen_lake")
    state, _ = env.reset(record.env_seed)
    shown, budget, reward = [], 6, None
    for turn in record.turns:
        shown.append((state, budget, reward))
        state, reward, _, _, _ = env.step(turn.actions[0])
        budget -= 1
    return shown


def _first(state, budget):
    rules = "Reach G, avoid O.\nActions: Left, Down, Right, Up.\n"
    return f"{HEADER}{rules}State:\n{state}\n{budget} actions left.{ASSISTANT}"


def test_compact_full_chat_is_the_short_prompt_written_by_hand(tiny_policy):
    _, tokenizer = tiny_policy
    formatter = ChatFormatter(tokenizer, reply_prefix="<think>", style="compact")
    records = run_rollouts(_spec(), ScriptedBackend("describe_random", tokenizer), formatter, seed=1)
    assert any(len(r.turns) > 2 for r in records)
    for record in records:
        expected = ""
        for turn, (state, budget, reward) in zip(record.turns, _shown(record), strict=True):
            if not expected:
                expected = _first(state, budget)
            else:
                expected += f"\n{HEADER}Reward: {reward:g}\nState:\n{state}\n{budget} actions left.{ASSISTANT}"
            expected += turn.response.removeprefix("<think>") + "<|im_end|>"
        assert tokenizer.decode(record.input_ids) == expected
        assert "system" not in expected and "legend" not in expected


def test_compact_single_turn_window_shows_only_the_current_state(tiny_policy):
    _, tokenizer = tiny_policy
    formatter = ChatFormatter(tokenizer, reply_prefix="<think>", style="compact")
    records = run_rollouts(_spec("single_turn", 1), ScriptedBackend("describe_random", tokenizer), formatter, seed=2)
    for record in records:
        start = 0
        for length, (state, budget, _) in zip(record.segment_lengths, _shown(record), strict=True):
            ids, mask = record.input_ids[start : start + length], record.loss_mask[start : start + length]
            cut = mask.index(1)
            assert tokenizer.decode(ids[:cut]) == _first(state, budget)
            start += length


def test_describe_random_thinks_the_goal_direction_and_acts_at_random(tiny_policy):
    _, tokenizer = tiny_policy
    spec = RolloutSpec("frozen_lake", list(range(40)), 4, max_turns=5, max_actions_per_turn=1, max_actions_per_traj=5)
    records = run_rollouts(
        spec, ScriptedBackend("describe_random", tokenizer), ChatFormatter(tokenizer, reply_prefix="<think>"), seed=0
    )
    toward, counts = 0, {}
    for record in records:
        for turn, (state, _, _) in zip(record.turns, _shown(record), strict=True):
            assert turn.think == _goal_from_render(state)
            assert turn.valid and len(turn.actions) == 1
            action = turn.actions[0]
            counts[action] = counts.get(action, 0) + 1
            words = {"Down": "down", "Up": "up", "Right": "right", "Left": "left"}
            toward += words[action] in turn.think
    total = sum(counts.values())
    assert total > 300 and min(counts.values()) > total / 4 - 0.06 * total  # uniform over the four actions
    # the think says nothing of the choice: a move toward the goal is as frequent as chance (1.5 of 4 directions on
    # average here, ~0.38), far from what a policy acting on the description would show
    assert abs(toward / total - 0.38) < 0.08


def _frozenlake(*overrides: str):
    """configs/frozenlake.yaml with RAGEN's full prompt, the whole chat and a random bootstrap of the run's own seed
    (the shipped config's compact prompt, window, teacher_mix bootstrap and shared bootstrap seed are what the
    overrides below change)."""
    import yaml

    from ragen_core.config import build_config

    tree = yaml.safe_load(Path("configs/frozenlake.yaml").read_text())
    tree["rollout"].update(prompt_style="full", context_window_mode="full", max_context_window=None)
    tree["bootstrap"]["policy"] = "random"
    del tree["bootstrap"]["seed"]
    return build_config(tree, list(overrides))


def test_bootstrap_key_covers_the_prompts_and_the_shared_seed(tmp_path: Path):
    base = _frozenlake()
    key = bootstrap_key(base, tmp_path)
    assert bootstrap_key(_frozenlake("rollout.prompt_style=compact"), tmp_path) != key
    windowed = ["rollout.context_window_mode=single_turn", "rollout.max_context_window=1"]
    assert bootstrap_key(_frozenlake(*windowed), tmp_path) != key
    assert bootstrap_key(_frozenlake("seed=1"), tmp_path) != key
    shared = [bootstrap_key(_frozenlake(f"seed={s}", "bootstrap.seed=0"), tmp_path) for s in (0, 1, 2)]
    assert set(shared) == {key}  # one bootstrap (seed 0's) for three RL seeds
    assert bootstrap_key(base, tmp_path) == key  # deterministic
    # teacher_prob is an option of teacher_mix only: the random policy's key ignores it
    assert bootstrap_key(_frozenlake("bootstrap.teacher_prob=0.9"), tmp_path) == key
    mixes = [_frozenlake("bootstrap.policy=teacher_mix", f"bootstrap.teacher_prob={p}") for p in (0.5, 0.51)]
    assert len({key, *(bootstrap_key(c, tmp_path) for c in mixes)}) == 3
    # env keys added later count only once moved off the value that behaves as before they existed
    assert bootstrap_key(_frozenlake("env.user_code_timeout_s=300", "env.tool_timeout_s=10"), tmp_path) == key
    assert bootstrap_key(_frozenlake("env.user_code_timeout_s=20"), tmp_path) != key
    assert not {"tool_timeout_s", "remote", "mcp", "user_code_timeout_s"} & set(base.hashed_tree()["env"])


def test_bootstrap_key_follows_what_the_policy_does_not_its_name(tmp_path: Path, monkeypatch):
    config = load_config("configs/frozenlake.yaml", ["bootstrap.policy=teacher_mix"])
    key = bootstrap_key(config, tmp_path)

    def always_left(context, rng, teacher_prob=0.5):  # the same name and options, another behaviour
        return scripted.ScriptedReply(["Left"], context.env.describe())

    policies = dict(scripted._POLICIES.items())
    monkeypatch.setattr(scripted, "_POLICIES", Registry("scripted policy", {**policies, "teacher_mix": always_left}))
    assert bootstrap_key(config, tmp_path) != key
    monkeypatch.setattr(scripted, "_POLICIES", Registry("scripted policy", policies))
    assert bootstrap_key(config, tmp_path) == key


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["bootstrap.policy=describe_random"], "bandit has none"),
        (
            ["env.name=frozen_lake", "bootstrap.policy=describe_random", "rollout.enable_think=false"],
            "set rollout.enable_think=true",
        ),
        (["rollout.prompt_style=short"], "prompt_style"),
    ],
)
def test_describing_bootstrap_needs_an_env_that_describes_and_thinking(overrides, message):
    with pytest.raises(Exception, match=message):
        load_config("configs/bandit.yaml", overrides)


def test_bootstrap_key_names_the_code_by_its_lineage(tmp_path: Path):
    base = _frozenlake()
    assert bootstrap_key(base, tmp_path) == bootstrap_key(base, tmp_path, code=lineage_root())
    assert bootstrap_key(base, tmp_path, code="a" * 16) != bootstrap_key(base, tmp_path, code="b" * 16)
