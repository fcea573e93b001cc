"""Configs are bounded before they are expanded (issue 29, items 9 and 11): an alias bomb, a 20,000-deep text, a
binary file and an oversized sweep are refused by the real commands with one line on stderr, exit status 2, before a
data root is created; a search's size is computed from its axes, never by expanding it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.config import YAML_MAX_DEPTH, YAML_MAX_NODES, ConfigError, load_config, load_yaml
from ragen_core.sweep import DEFAULT_MAX_POINTS, SweepError, plan_sweep

PROJECT = Path(__file__).resolve().parents[1]
BANDIT = PROJECT / "configs" / "bandit.yaml"


def _laughs(levels: int, width: int = 10) -> str:
    """Billion laughs inside env.options: ``width ** levels`` values from a few hundred bytes."""
    lines = ["env:", "  name: bandit", "  options:", f"    l0: &l0 [{', '.join(['lol'] * width)}]"]
    for level in range(1, levels):
        lines.append(f"    l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def _refused_before_anything(tmp_path: Path, *args: object):
    root = tmp_path / "never-made"
    result = CliRunner().invoke(app, [str(a) for a in args] + ["--data-root", str(root)])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error:")
    assert not root.exists()
    return result.stderr


def test_an_alias_bomb_in_env_options_is_refused_at_load(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_laughs(9))  # 10^9 values once expanded
    assert len(bomb.read_bytes()) < 1000
    message = _refused_before_anything(tmp_path, "train", "--config", bomb)
    assert "bomb.yaml" in message and f"more than {YAML_MAX_NODES:,} values" in message
    # the same as an override value, and through a sweep's base config
    override = "env.options={" + _laughs(6).split("options:\n", 1)[1].replace("\n    ", ", ").strip() + "}"
    assert "more than" in _refused_before_anything(tmp_path, "train", "--config", BANDIT, override)
    assert "more than" in _refused_before_anything(tmp_path, "sweep", "--config", bomb, "--seeds", "2")


def test_the_expanded_size_is_counted_through_the_aliases():
    # {a: &a [m scalars], b: [n times *a]}: the mapping, two keys, two lists, m scalars, n copies of a's m + 1 values
    m = 1009

    def text(n: int) -> str:
        return f"a: &a [{', '.join(['x'] * m)}]\nb: [{', '.join(['*a'] * n)}]\n"

    def expanded(n: int) -> int:
        return 1 + 2 + 2 + m + n * (m + 1)

    assert expanded(98) <= YAML_MAX_NODES < expanded(99)
    assert len(load_yaml(text(98), "test")["b"]) == 98
    with pytest.raises(ConfigError, match=f"more than {YAML_MAX_NODES:,} values"):
        load_yaml(text(99), "test")


@pytest.mark.parametrize("shape", ["flow", "block"])
def test_a_20000_deep_yaml_is_one_line_not_a_recursion_error(tmp_path, shape):
    deep = tmp_path / "deep.yaml"
    if shape == "flow":
        deep.write_text("env:\n  options:\n    x: " + "[" * 20_000 + "]" * 20_000 + "\n")
    else:
        deep.write_text("".join(f"{'  ' * i}k{i}:\n" for i in range(500)) + "  " * 500 + "v: 1\n")
    message = _refused_before_anything(tmp_path, "train", "--config", deep)
    assert f"nests deeper than {YAML_MAX_DEPTH} levels" in message
    load_yaml("a:" + " [" * (YAML_MAX_DEPTH - 1) + "]" * (YAML_MAX_DEPTH - 1), "at the limit")  # 64 levels load


@pytest.mark.parametrize("binary", ["/bin/ls", "nul"])
def test_a_binary_config_is_one_line(tmp_path, binary):
    path = Path(binary)
    if binary == "nul":
        path = tmp_path / "nul.yaml"
        path.write_bytes(b"seed: 1\n\x00\x00")
    if not path.is_file():
        pytest.skip("no /bin/ls here")
    message = _refused_before_anything(tmp_path, "train", "--config", path)
    assert "is not a YAML text file" in message and str(path) in message


def test_a_huge_config_file_is_refused_by_its_size(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("seed: 1\n" + "#" * 2_000_000 + "\n")
    assert "bytes" in _refused_before_anything(tmp_path, "train", "--config", big)


def test_a_grid_of_ten_keys_by_ten_values_is_refused_by_its_size_before_expanding(tmp_path):
    grids = [f"--grid=actor.lr{k}=[{','.join(str(v) for v in range(10))}]" for k in range(10)]
    message = _refused_before_anything(tmp_path, "sweep", "--config", BANDIT, *grids)
    assert f"has {10**10:,} points" in message and "--max-points 10000000000" in message


def test_max_points_default_and_raising_it(tmp_path):
    ratios = "algorithm.filter_ratio=[0.25,0.5,0.75,1.0]"
    points = 4 * 26  # 4 ratios x 26 seeds = 104 > 100
    assert points > DEFAULT_MAX_POINTS == 100
    message = _refused_before_anything(tmp_path, "sweep", "--config", BANDIT, "--grid", ratios, "--seeds", "26")
    assert f"has {points} points (4 x 26), more than --max-points 100" in message
    assert f"pass --max-points {points}" in message
    message = _refused_before_anything(
        tmp_path, "sweep", "--config", BANDIT, "--grid", ratios, "--seeds", "2", "--max-points", "7"
    )
    assert "has 8 points" in message
    base = load_config(BANDIT).to_dict()
    plan = plan_sweep(base, [ratios], seeds=2, max_points=8)
    assert len(plan.points) == math.prod([4, 2])
    with pytest.raises(SweepError, match="--seeds"):
        plan_sweep(base, seeds=10**9, max_points=10**12)  # a count is bounded before it becomes a list


# -- absurd numbers and text that is not one printable line (issue 39) ----------------------------------------------


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("seed=100000000000000000000000000000", "seed: Input should be less than or equal to 4294967295"),
        ("seed=1.0e+29", "seed: "),
        ("seed=-1", "seed: Input should be greater than or equal to 0"),  # abs() made it the run of seed 1
        ("eval.seed=4294967296", "eval.seed: Input should be less than or equal to 4294967295"),
        ("bootstrap.seed=-7", "bootstrap.seed: Input should be greater than or equal to 0"),
        ("model.tiny.seed=18446744073709551616", "model.tiny.seed: Input should be less than or equal to"),
        ("actor.lr=1e308", "actor.lr: Input should be less than or equal to 10"),
        ("actor.lr=.nan", "actor.lr: Input should be a finite number"),
        ("critic.lr=-0.1", "critic.lr: Input should be greater than 0"),
        ("rollout.group_size=-3", "rollout.group_size: Input should be greater than 0"),
        ("rollout.top_k=100000000000000000000", "rollout.top_k: Input should be less than or equal to 1000000"),
        ("trainer.mi_prompts=100000000000000", "trainer.mi_prompts: Input should be less than or equal to 1000000"),
        ("algorithm.clip_low=1.5", "algorithm.clip_low: Input should be less than or equal to 1"),
        ("algorithm.kl_coef=1.0e+300", "algorithm.kl_coef: Input should be less than or equal to 1000000"),
        ("rollout.format_penalty=-1.0e+300", "rollout.format_penalty: Input should be greater than or equal to"),
        ("rollout.temperature=.inf", "rollout.temperature: Input should be a finite number"),
    ],
)
def test_an_absurd_number_is_refused_in_one_line_when_the_config_loads(tmp_path, override, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config(BANDIT, [override])
    error = _refused_before_anything(tmp_path, "train", "--config", BANDIT, override)
    assert expected in error and error.startswith("error: invalid config: ")


def test_the_largest_sensible_numbers_still_load():
    config = load_config(BANDIT, ["seed=4294967295", "actor.lr=10", "rollout.top_k=1000000", "algorithm.clip_low=1"])
    assert (config.seed, config.actor.lr, config.rollout.top_k, config.algorithm.clip_low) == (2**32 - 1, 10, 10**6, 1)


def _numeric_fields(model, prefix=""):
    """(dotted key, field) of every number-valued key of the config tree (Literal choices aside)."""
    from pydantic import BaseModel

    from ragen_core.config.base import leaf_types

    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _numeric_fields(field.annotation, f"{prefix}{name}.")
        elif (leaf_types(field.annotation) - {type(None)}) <= {int, float} and "Literal" not in str(field.annotation):
            yield prefix + name, field


def test_every_number_of_the_config_is_bounded_on_both_sides():
    """No key takes any number: a new key without bounds fails here (probed with +-1e300 and an integer of 40 digits,
    each refused by that key's own check)."""
    from ragen_core.config import RunConfig
    from ragen_core.config.loading import build_config

    keys = [key for key, _ in _numeric_fields(RunConfig)]
    assert "seed" in keys and "actor.lr" in keys and len(keys) > 40
    for key in keys:
        for value in ("1.0e+300", "-1.0e+300", "1" + "0" * 40, "-" + "1" + "0" * 40):
            with pytest.raises(ConfigError, match=re.escape(key)):
                build_config({}, [f"{key}={value}"])


@pytest.mark.parametrize(
    ("override", "shown"),
    [
        (r'model.path="/models/a\nb"', r"'/models/a\nb' holds the control character '\n'"),
        (r'model.path="/models/\e[2Jx"', r"'/models/\x1b[2Jx' holds the control character '\x1b'"),
        (r'critic.path="/m\rx"', r"'/m\rx' holds the control character '\r'"),
        (r'rollout.vllm.python="/bin/\u0085py"', r"holds the control character '\x85'"),
        (r'env.val_envs=["bandit", "band\u0007it"]', r"holds the control character '\x07'"),
        (r'rollout.scripted_policy="ran\u009bdom"', r"holds the control character '\x9b'"),
    ],
)
def test_text_with_a_newline_or_an_escape_sequence_is_refused_in_one_line(tmp_path, override, shown):
    """A path or a name that would reach the logs, Prefect's UI or a terminal as another line or a screen command is
    refused when the config loads; the message shows it escaped (no raw control character reaches the terminal)."""
    error = _refused_before_anything(tmp_path, "train", "--config", BANDIT, override)
    assert shown in error and "one line of printable characters" in error
    assert all(c == "\n" or (" " <= c and not 0x7F <= ord(c) < 0xA0) for c in error), repr(error)


# Issue 39, item 3: env.options numbers are bounded where each env declares its options, and said when the config
# loads. Each case: (config, override, the bound the message states); the env's own module holds the bound.
ENV_OPTION_CASES = [
    ("sokoban.yaml", "env.options={dim_room: [1000000000, 6]}", "dim_room's sides must be a whole number from 4"),
    ("sokoban.yaml", "env.options={num_boxes: 4}", "num_boxes must be a whole number from 1 to 3, got 4"),
    ("sokoban.yaml", "env.options={search_depth: 5000}", "search_depth must be a whole number from 1 to 300"),
    ("frozenlake.yaml", "env.options={size: 1000000000}", "size must be a whole number from 2 to 32, got 1000000000"),
    ("frozenlake.yaml", "env.options={size: true}", "size must be a whole number from 2 to 32, got True"),
    ("countdown.yaml", "env.options={max_number: 10000000000000}", "max_number must be a whole number from 1 to"),
    ("game_2048.yaml", "env.options={max_steps: 1000000000000}", "max_steps (or null for no limit) must be a whole"),
    ("rubikscube.yaml", "env.options={scramble_depth: 99999999}", "scramble_depth must be a whole number from 1 to"),
    ("bandit.yaml", "env.options={high_reward: .inf}", "high_reward must be a number from -1e+06 to 1e+06, got inf"),
    ("sudoku.yaml", "env.options={max_steps: 1e9}", "max_steps must be a whole number from 1 to 10000, got '1e9'"),
]


@pytest.mark.parametrize(("config", "override", "bound"), ENV_OPTION_CASES, ids=[c[1] for c in ENV_OPTION_CASES])
def test_an_env_option_out_of_its_bounds_is_one_line_before_anything(tmp_path, config, override, bound):
    import time

    started = time.monotonic()
    message = _refused_before_anything(tmp_path, "train", "--config", PROJECT / "configs" / config, override)
    assert f"env: options: {bound}" in message
    assert time.monotonic() - started < 30  # said at load: no room of a billion cells is ever built


def test_env_options_are_checked_against_every_env_the_run_plays(tmp_path):
    """The options reach the validation envs too: one that does not take them is said at load, not mid-run."""
    message = _refused_before_anything(
        tmp_path,
        "train",
        "--config",
        PROJECT / "configs" / "sokoban.yaml",
        "env.options={num_boxes: 2}",
        "env.val_envs=[sokoban, bandit]",
    )
    assert (
        "environment 'bandit' does not take the option(s) num_boxes (it takes high_name, high_prob, high_reward, "
        "low_name, low_reward, name): remove or rename env.options.num_boxes"
    ) in message


def test_an_unknown_env_option_is_named_with_the_ones_the_env_takes():
    """Only the unknown options are named, with the options the env takes, in one line (the message once listed
    every option given, valid ones included, and named the culprit only in a trailing TypeError); a class of the
    user's own is read from its own signature."""
    from ragen_core.envs import make_env
    from ragen_core.envs.base import TextEnv, accepted_options

    with pytest.raises(ValueError) as caught:
        make_env("frozen_lake", size=4, is_slipery=False, colour="red")
    assert str(caught.value) == (
        "environment 'frozen_lake' does not take the option(s) colour, is_slipery (it takes desc, is_slippery, "
        "name, p, size, success_rate): remove or rename env.options.colour"
    )

    class Strict(TextEnv):
        def __init__(self, sides: int = 2, *, label: str = "") -> None:
            self.sides, self.label = sides, label

    assert accepted_options(Strict) == ["label", "sides"]
    assert accepted_options(lambda **kw: Strict(**kw)) is None  # cannot be told: no class to read


def test_env_options_within_their_bounds_load():
    from ragen_core.run.checks import load_run_config

    config = load_run_config(PROJECT / "configs" / "sokoban.yaml", ["env.options={dim_room: [16, 16], num_boxes: 3}"])
    assert config.env.options == {"dim_room": [16, 16], "num_boxes": 3}
