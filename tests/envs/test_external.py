"""Environments from the user's own code: ``package.module:Class`` of a module on the import path, and names that an
installed distribution registers under the entry-point group ``ragen.envs`` (ragen_core/envs/external.py)."""

from __future__ import annotations

import sys

import pytest

from ragen_core.config import ConfigError
from ragen_core.envs import available_envs, env_factory, make_env
from ragen_core.envs.external import check_import_path, env_source, import_object, metric_env_name
from ragen_core.run.checks import build_run_config
from ragen_core.run.record import code_sources, default_run_id
from tests.envs.user_code import unique, write_distribution, write_env_module


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """A folder on the import path (``sys.path``), as PYTHONPATH puts one."""
    folder = tmp_path / "user"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    return folder


def _play(env, seed: int, action: str) -> tuple[str, float, bool]:
    env.reset(seed)
    _, reward, terminated, _, _ = env.step(action)
    return action, reward, terminated


def test_an_env_from_a_module_on_the_import_path_plays_by_its_own_rules(on_path):
    path = write_env_module(on_path, unique("user_envs"))
    env = make_env(path)
    assert type(env).__name__ == "CoinEnv" and env.action_names == ["heads", "tails"]
    assert env.reset(3)[0] == "The coin shows tails." and env.reset(4)[0] == "The coin shows heads."
    assert _play(env, 3, "tails") == ("tails", 1.0, True) and _play(env, 3, "heads") == ("heads", 0.0, True)
    assert make_env(path, sides=["up", "down"]).reset(1)[0] == "The coin shows down."  # env.options reach it


def test_an_entry_point_of_an_installed_distribution_is_an_env_name(on_path):
    entry, package = unique("coin"), unique("coin_pkg")
    write_distribution(on_path, "coin-dist", "0.3.1", entry, package)
    assert entry in available_envs()
    env = make_env(entry)
    assert _play(env, 6, "heads") == ("heads", 1.0, True)
    source = env_source(entry, env_factory(entry))
    assert (source.import_path, source.distribution, source.version) == (f"{package}:CoinEnv", "coin-dist", "0.3.1")


def test_a_distribution_cannot_take_a_built_in_name(on_path):
    write_distribution(on_path, "shadow-dist", "1.0", "bandit", unique("shadow_pkg"))
    assert type(make_env("bandit")).__module__ == "ragen_core.envs.bandit"


def test_a_run_records_where_its_env_code_comes_from(on_path):
    path = write_env_module(on_path, unique("user_envs"))
    entry, package = unique("coin"), unique("coin_pkg")
    write_distribution(on_path, "coin-dist", "2.0", entry, package)
    config = build_run_config(overrides=[f"env.name={path}", f"env.val_envs=[{entry}, bandit]"])
    sources = code_sources(config)
    assert sources[path] == {"import_path": path, "distribution": None, "version": None}
    assert sources[entry] == {"import_path": f"{package}:CoinEnv", "distribution": "coin-dist", "version": "2.0"}
    assert sources["bandit"]["import_path"].startswith("ragen_core.envs.bandit:")
    assert default_run_id(config).startswith("CoinEnv-")  # a run id takes no ':'


def test_a_processes_runs_look_up_where_their_code_comes_from_once(on_path, monkeypatch):
    """The distributions are read once per env in a process (each manifest of every run asks again): the second
    answer is the first's, and reads none."""
    from importlib import metadata

    reads = []
    read = metadata.packages_distributions
    monkeypatch.setattr(metadata, "packages_distributions", lambda: reads.append(1) or read())
    path = write_env_module(on_path, unique("user_envs"))
    config = build_run_config(overrides=[f"env.name={path}", "env.val_envs=[bandit]"])
    first = code_sources(config)
    assert len(reads) >= 1 and first[path] == env_source(path, env_factory(path)).to_dict()
    reads.clear()
    assert code_sources(config) == first and reads == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("user_envs_x:1Env", "is not an import path: write package.module:Name"),
        ("user envs:CoinEnv", "is not an import path"),
        ("../evil:CoinEnv", "is not an import path"),
        ("no_such_module_4711:CoinEnv", "cannot import module 'no_such_module_4711' (no module named"),
        ("json:CoinEnv", "module 'json' has no attribute 'CoinEnv'"),
        ("json:dumps", "'json:dumps' is a function that is not a TextEnv: subclass ragen_core.envs.TextEnv"),
        ("json:JSONDecoder", "'json:JSONDecoder' is a class that is not a TextEnv"),
        ("no_such_env", "unknown environment 'no_such_env'; registered: bandit"),
    ],
)
def test_a_bad_env_name_is_one_line_before_anything_runs(name, expected):
    with pytest.raises(ConfigError) as caught:
        build_run_config(overrides=[f"env.name={name}"])
    message = str(caught.value).splitlines()[-1]
    assert "env.name: " in message and expected in message, message


def test_a_class_missing_part_of_the_protocol_is_named_with_what_it_lacks(on_path):
    module = unique("user_envs")
    write_env_module(on_path, module)
    with pytest.raises(
        ValueError,
        match=r"'[a-z_0-9]+:NoBounds' does not implement the TextEnv protocol: missing "
        r"step, render, action_names, instruction, success, reward_bounds",
    ):
        env_factory(f"{module}:NoBounds")


def test_a_module_that_raises_while_importing_is_one_line(on_path):
    module = unique("broken_envs")
    (on_path / f"{module}.py").write_text("import no_such_dependency_4711\n")
    with pytest.raises(ValueError) as caught:
        env_factory(f"{module}:Env", "env.val_envs")
    assert str(caught.value) == (
        f"env.val_envs: importing module {module!r} failed: ModuleNotFoundError: No module "
        "named 'no_such_dependency_4711'"
    )
    assert module not in sys.modules


def test_import_paths_are_checked_before_anything_is_imported():
    assert check_import_path("a.b_c:D.e", "k") == ("a.b_c", "D.e")
    assert import_object("json:JSONDecoder.decode", "k").__qualname__ == "JSONDecoder.decode"
    for bad in ("a", "a:b:c", ":b", "a.:b", "a:1b", "a-b:c", "a:b\n"):
        with pytest.raises(ValueError, match="is not an import path"):
            check_import_path(bad, "k")


def test_metric_names_take_an_import_paths_class_and_a_clash_is_refused(on_path):
    assert metric_env_name("bandit") == "bandit" and metric_env_name("coin-entry") == "coin-entry"
    assert metric_env_name("my_envs.coin:CoinEnv") == "CoinEnv"
    assert metric_env_name("my_envs.coin:Outer.Inner") == "Inner"
    first, second = write_env_module(on_path, unique("user_envs")), write_env_module(on_path, unique("user_envs"))
    with pytest.raises(ConfigError) as caught:
        build_run_config(overrides=[f"env.name={first}", f"env.val_envs=[{first},{second}]"])
    assert f"env.val_envs: {first} and {second} would share the metric names val/CoinEnv/*" in str(caught.value)
    build_run_config(overrides=[f"env.name={first}", f"env.val_envs=[{first},bandit]"])  # no clash: accepted
