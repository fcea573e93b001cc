import pytest
from pydantic import ValidationError

from ragen_core.algos import needs_critic
from ragen_core.config import PRESETS, ConfigError, parse_override
from ragen_core.run.checks import build_run_config as build_config
from ragen_core.run.checks import load_run_config as load_config


def test_defaults_follow_the_starpo_s_preset():
    config = build_config()
    assert config.algorithm.preset == "starpo_s"
    assert (config.algorithm.clip_low, config.algorithm.clip_high) == (0.2, 0.28)
    assert config.algorithm.kl_coef == 0.0
    assert config.algorithm.filter_ratio == 0.25


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_switching_the_preset_changes_exactly_its_keys(estimator):
    vanilla = build_config(overrides=["algorithm.preset=starpo", f"algorithm.adv_estimator={estimator}"]).to_dict()
    stabilised = build_config(overrides=["algorithm.preset=starpo_s", f"algorithm.adv_estimator={estimator}"])
    stabilised = stabilised.to_dict()
    changed = {k for k in vanilla["algorithm"] if vanilla["algorithm"][k] != stabilised["algorithm"][k]}
    # clip_low is 0.2 in both presets, so it does not show up as a change
    assert changed == {"preset", "clip_high", "kl_coef", "filter_ratio"}
    assert {k: vanilla["algorithm"][k] for k in PRESETS["starpo"]} == PRESETS["starpo"]
    assert {k: stabilised["algorithm"][k] for k in PRESETS["starpo_s"]} == PRESETS["starpo_s"]
    assert {k for k in vanilla if k != "algorithm" and vanilla[k] != stabilised[k]} == set()
    assert PRESETS["starpo"] == {"clip_low": 0.2, "clip_high": 0.2, "kl_coef": 0.001, "filter_ratio": 1.0}
    assert PRESETS["starpo_s"] == {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0, "filter_ratio": 0.25}


def test_critic_only_for_value_estimators():
    assert needs_critic(build_config(overrides=["algorithm.adv_estimator=gae"]).algorithm.adv_estimator)
    assert needs_critic(build_config(overrides=["algorithm.adv_estimator=bi_level_gae"]).algorithm.adv_estimator)
    assert not needs_critic(build_config(overrides=["algorithm.adv_estimator=rloo"]).algorithm.adv_estimator)
    with pytest.raises(ConfigError, match="critic.mini_batch_size"):
        build_config(
            overrides=["algorithm.adv_estimator=gae", "critic.mini_batch_size=6", "critic.micro_batch_size=4"]
        )


def test_explicit_keys_override_the_preset():
    config = build_config(overrides=["algorithm.preset=starpo_s", "algorithm.filter_ratio=1.0"])
    assert config.algorithm.filter_ratio == 1.0 and config.algorithm.clip_high == 0.28


def test_overrides_parse_yaml_values():
    assert parse_override("rollout.group_size=8") == (["rollout", "group_size"], 8)
    assert parse_override("env.val_envs=[bandit, bandit_test]") == (["env", "val_envs"], ["bandit", "bandit_test"])
    config = build_config(overrides=["rollout.enable_think=false", "actor.lr=2e-4"])
    assert config.rollout.enable_think is False and config.actor.lr == pytest.approx(2e-4)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("rollout.group_sise=4", "rollout.group_sise"),
        ("rollout.group_size=abc", "rollout.group_size"),
        ("rollout.env_groups=-3", "rollout.env_groups"),
        ("algorithm.filter_ratio=1.5", "algorithm.filter_ratio"),
        ("env.name=chess", "env.name"),
        ("algorithm.adv_estimator=magic", "algorithm.adv_estimator"),
        ("trainer.iterations=0", "trainer.iterations"),
    ],
)
def test_bad_configs_name_the_key(override, key):
    with pytest.raises(ConfigError) as info:
        build_config(overrides=[override])
    assert key in str(info.value)


def test_override_without_equals_is_rejected():
    with pytest.raises(ConfigError, match="key.sub=value"):
        build_config(overrides=["rollout.group_size"])


def test_micro_batch_must_divide_mini_batch():
    with pytest.raises(ConfigError, match="multiple of"):
        build_config(overrides=["actor.mini_batch_size=10", "actor.micro_batch_size=4"])


def test_config_is_frozen_and_hash_is_stable(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 3\nrollout:\n  group_size: 4\n")
    first, second = load_config(path), load_config(path)
    assert first.config_hash() == second.config_hash()
    assert first.config_hash() != load_config(path, ["seed=4"]).config_hash()
    with pytest.raises(ValidationError):
        first.seed = 5  # type: ignore[misc]


def test_missing_or_malformed_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)


@pytest.mark.parametrize(
    ("text", "key", "why"),
    [
        ("actor.lr=true", "actor.lr", "boolean true"),
        ("trainer.iterations=yes", "trainer.iterations", "boolean true"),  # YAML 1.1 reads yes as true
        ("seed=off", "seed", "boolean false"),
        ("eval.temperature=on", "eval.temperature", "boolean true"),
        ("model.path=no", "model.path", "takes text"),
        ("rollout.enable_think=1", "rollout.enable_think", "true or false, not 1"),
        ("rollout.enable_think=0", "rollout.enable_think", "true or false, not 0"),
        ("rollout.enable_think='true'", "rollout.enable_think", "true or false, not 'true'"),
        ("algorithm.filter_largest=1", "algorithm.filter_largest", "true or false"),  # bool | None
        ("actor.zero_stage=true", "actor.zero_stage", "boolean true"),  # Literal[0, 1, 2, 3]: True == 1 in Python
    ],
)
def test_a_boolean_is_not_a_number_and_a_number_is_not_a_boolean(text, key, why):
    with pytest.raises(ConfigError) as info:
        build_config(overrides=[text])
    assert f"{key}: " in str(info.value) and why in str(info.value)


def test_booleans_and_numbers_of_their_own_kind_still_load(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  enable_think: no\nalgorithm:\n  filter_largest: null\nactor:\n  lr: 1\n")
    config = load_config(path, ["trainer.iterations=3", "eval.temperature=1"])
    assert config.rollout.enable_think is False and config.algorithm.filter_largest is None
    assert (config.actor.lr, config.trainer.iterations, config.eval.temperature) == (1.0, 3, 1.0)
    assert build_config(config.to_dict()) == config  # a stored config (a manifest's) loads back unchanged
    path.write_text("rollout:\n  enable_think: 1\n")
    with pytest.raises(ConfigError, match="rollout.enable_think: must be true or false"):
        load_config(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("actor:\n  lr: 0.1\n  grad_clip: 0.2\n  lr: 0.3\n", "key 'lr' appears twice in one section (lines 2 and 4)"),
        ("seed: 1\nactor: {lr: 0.1, lr: 0.2}\n", "key 'lr' appears twice in one section (lines 2 and 2)"),
        ("actor:\n  lr: 0.1\nactor:\n  grad_clip: 0.2\n", "key 'actor' appears twice in one section (lines 1 and 3)"),
    ],
)
def test_duplicate_yaml_keys_name_the_key_and_lines(tmp_path, text, message):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_yaml_merge_keys_may_still_override(tmp_path):
    path = tmp_path / "merge.yaml"
    path.write_text("actor: &a\n  lr: 0.1\ncritic:\n  <<: *a\n  lr: 0.2\n")
    assert load_config(path).critic.lr == 0.2


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["actor.lr=0.1", "actor.lr=0.2"], "actor.lr"),
        (["actor.lr=0.1", "seed=3", " actor.lr =0.1"], "actor.lr"),  # the same value twice is refused too
        (["actor={lr: 0.1}", "actor.lr=0.2"], "actor"),  # a section and a key inside it
        (["actor.lr=0.2", "actor={lr: 0.1}"], "actor"),
    ],
)
def test_a_key_overridden_twice_is_an_error(overrides, key):
    with pytest.raises(ConfigError) as info:
        build_config(overrides=overrides)
    assert f"both set {key};" in str(info.value)


def test_overrides_of_different_keys_of_one_section_are_fine():
    config = build_config(overrides=["actor.lr=0.1", "actor.grad_clip=0.3"])
    assert (config.actor.lr, config.actor.grad_clip) == (0.1, 0.3)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.iterations=1000000000000", "trainer.iterations: Input should be less than or equal to 1000000"),
        ("eval.instances=1000001", "eval.instances: Input should be less than or equal to 1000000"),
        ("rollout.max_new_tokens=100000000", "rollout.max_new_tokens: Input should be less than or equal to"),
        ("rollout.max_new_tokens=200000", "rollout.max_new_tokens: Input should be less than or equal to 131072"),
        ("actor.lr=inf", "actor.lr: Input should be a finite number"),
        ("actor.lr=.nan", "actor.lr: Input should be a finite number"),
        ("algorithm.clip_high=-.inf", "algorithm.clip_high: Input should be a finite number"),
    ],
)
def test_numbers_are_finite_and_counts_bounded(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("configs/bandit.yaml", [override])


def test_every_shipped_config_stays_within_the_bounds():
    from pathlib import Path

    for path in sorted(Path("configs").glob("*.yaml")):
        load_config(path)


def test_train_refuses_an_unbounded_config_before_creating_anything(tmp_path):
    from typer.testing import CliRunner

    from ragen_cli.main import app

    root = tmp_path / "never-made"
    result = CliRunner().invoke(
        app, ["train", "--config", "configs/bandit.yaml", "--data-root", str(root), "trainer.iterations=1000000000000"]
    )
    assert result.exit_code == 2 and "trainer.iterations" in result.output and "Traceback" not in result.output
    assert not root.exists()


def test_a_run_stored_before_the_reply_format_micro_batch_budget_and_truncation_warning_replays_as_it_ran():
    from ragen_core.config import build_config, stored_config

    def keys(config):
        return config.rollout.reply_format, config.monitor.truncated_share, config.actor.micro_batch_tokens

    assert keys(build_config(stored_config({}))) == ("lenient", None, None)  # a manifest from before these keys
    assert keys(build_config({})) == ("strict", 0.2, 8192)


def test_a_config_error_names_its_key_once():
    """A problem that names its own key is not prefixed with its section (or the tree's root) again."""
    from ragen_core.config.errors import config_error

    assert str(config_error("<root>", "env.name: unknown environment 'x'")) == (
        "invalid config:\n  env.name: unknown environment 'x'"
    )
    assert str(config_error("algorithm", "algorithm.filter_ratio=1.5: out of (0, 1]")) == (
        "invalid config:\n  algorithm.filter_ratio=1.5: out of (0, 1]"
    )
    assert str(config_error("algorithm", "clip_low above clip_high")) == (
        "invalid config:\n  algorithm: clip_low above clip_high"
    )


def test_an_unknown_preset_is_the_one_line_not_the_keys_it_would_have_set():
    with pytest.raises(ConfigError) as refused:
        build_config({}, ["algorithm.preset=starpo_z"])
    lines = str(refused.value).splitlines()[1:]
    assert len(lines) == 1 and lines[0].startswith("  algorithm.preset: ") and "starpo_s" in lines[0]
    with pytest.raises(ConfigError) as both:  # a real second mistake elsewhere is still named
        build_config({}, ["algorithm.preset=starpo_z", "rollout.group_size=many"])
    assert "rollout.group_size" in str(both.value)
