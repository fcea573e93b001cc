"""``ragen export``'s README says how to prompt each run's policy (issue 40, section 4 item 6): the system prompt, the
first user message of an env instance and the chat template's use, with a ``transformers`` snippet that runs as
written; the prompt it builds is, token for token, the one the run's rollouts stored for that instance."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pyarrow.compute as pc
import pytest
from typer.testing import CliRunner

from ragen_cli.main import app
from ragen_core.agent.prompts import SYSTEM_PROMPT
from ragen_core.storage import DataLake

RUN = "chat"


@pytest.fixture(scope="module")
def root(prefect_harness, tmp_path_factory, tiny_model_dir):
    from flows.train import train

    root = tmp_path_factory.mktemp("chat")
    config = {
        "model": {"path": str(tiny_model_dir)},
        "env": {"val_envs": ["bandit"]},
        "rollout": {"env_groups": 2, "group_size": 2, "max_new_tokens": 6},
        "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
        "trainer": {"iterations": 1},
        "eval": {"every": 1, "instances": 2},
    }
    train(config, data_root=str(root), run_id=RUN)
    return root


def _snippet(readme: str) -> str:
    (code,) = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    return code


def test_the_readme_snippet_runs_and_builds_the_prompt_the_run_stored(root, tmp_path):
    out = tmp_path / "ds"
    result = CliRunner().invoke(app, ["export", RUN, "--out", str(out), "--data-root", str(root)])
    assert result.exit_code == 0, result.output
    readme = (out / "README.md").read_text()
    assert f"## Prompting the policy of `{RUN}`" in readme and f"system prompt `{SYSTEM_PROMPT}`" in readme
    lake = DataLake(root)
    assert f'model_dir = "{lake.checkpoint_dir(RUN, 1) / "hf"}"' in readme  # its newest checkpoint's export
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(_snippet(readme), namespace)  # as written: loads the export, renders the chat, generates
    assert [m["role"] for m in namespace["messages"]] == ["system", "user"]
    # the stored prompt of that instance: the final validation (the checkpoint's policy), group 0, up to the first
    # token the policy sampled
    rows = lake.read_table("trajectories", RUN, 1)
    rows = rows.filter(pc.and_(pc.equal(rows["env"], "bandit"), pc.equal(rows["group_id"], 0))).to_pylist()
    stored = rows[0]["input_ids"][: rows[0]["loss_mask"].index(1)]
    assert namespace["inputs"]["input_ids"][0].tolist() == stored


def test_a_run_of_the_users_own_env_is_left_out_without_importing_it(root, tmp_path, monkeypatch):
    """A manifest naming an env of the user's code: the README says it is left out, and the module (which would
    write a marker when imported) is never imported."""
    from ragen_core.run.chat import export_notes
    from tests.envs.user_code import unique, write_env_module

    marker = tmp_path / "imported"
    planted = unique("planted_chat")
    write_env_module(tmp_path / "code", planted, marker)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    lake = DataLake(root)
    manifest = lake.read_manifest(RUN)
    config = {**manifest.config, "env": {**manifest.config["env"], "name": f"{planted}:CoinEnv"}}
    lake.write_manifest("chat-planted", manifest.updated(run_id="chat-planted", config=config))
    notes = export_notes(lake, ["chat-planted", RUN]).markdown
    assert "## Prompting the policy of `chat-planted`\n\nNot written out: " in notes
    assert f'names code of its own (env.name="{planted}:CoinEnv")' in notes
    assert "## Prompting the policy of `chat`" in notes and notes.count("```python") == 1
    assert not marker.exists()
    # what the note tells the user to do is what `ragen export` takes: --trust-env-module, never an override
    assert "`--trust-env-module`" in notes and "again to use it" not in notes
    trusted = export_notes(lake, ["chat-planted"], frozenset({"module"})).markdown
    assert "## Prompting the policy of `chat-planted`" in trusted and trusted.count("```python") == 1
    assert marker.exists()  # imported: the user asked for it


def test_ragen_export_takes_trust_env_module(root, tmp_path):
    """The flag the README's note names is one `ragen export` takes (it refused it before)."""
    from typer.testing import CliRunner

    from ragen_cli.main import app

    out = tmp_path / "ds"
    result = CliRunner().invoke(
        app, ["export", RUN, "--out", str(out), "--trust-env-module", "--data-root", str(root)]
    )
    assert result.exit_code == 0, result.output
    assert f"## Prompting the policy of `{RUN}`" in (out / "README.md").read_text()


def test_the_policy_is_printed_and_with_model_copied_into_the_export(root, tmp_path, monkeypatch):
    lake = DataLake(root)
    policy = lake.checkpoint_dir(RUN, 1) / "hf"
    plain = CliRunner().invoke(app, ["export", RUN, "--out", str(tmp_path / "plain"), "--data-root", str(root)])
    assert plain.exit_code == 0, plain.output
    assert f"policy of {RUN}: {policy} (not copied: --model copies it into the export)" in plain.output
    assert not (tmp_path / "plain" / "models").exists()
    out = tmp_path / "with-model"
    result = CliRunner().invoke(app, ["export", RUN, "--model", "--out", str(out), "--data-root", str(root)])
    assert result.exit_code == 0, result.output
    copied = out / "models" / RUN
    assert f"policy of {RUN}: {copied}\n" in result.output
    files = sorted(p.relative_to(policy) for p in policy.rglob("*") if p.is_file())
    assert files and files == sorted(p.relative_to(copied) for p in copied.rglob("*") if p.is_file())
    assert all((copied / f).read_bytes() == (policy / f).read_bytes() for f in files)
    readme = (out / "README.md").read_text()
    # the copy named from the export's folder, written out: the snippet runs from any folder (a relative path was
    # looked up from where it ran, and transformers took the missing folder for a hub id)
    assert f'export_dir = "{out.resolve()}"' in readme
    assert f'model_dir = os.path.join(export_dir, "models/{RUN}")' in readme
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(_snippet(readme), namespace)  # loads the copy, from another folder
    assert namespace["model"].config.vocab_size > 0
    assert namespace["model_dir"] == str(copied.resolve())
    moved = tmp_path / "moved"
    out.rename(moved)  # a moved export: the snippet says which line to change, never a hub lookup
    with pytest.raises(SystemExit, match=r"no policy at .*: set export_dir to the folder of this README"):
        exec(_snippet((moved / "README.md").read_text()), {})


def test_a_link_in_the_policy_folder_is_refused_and_nothing_is_written(root, tmp_path):
    import shutil

    copy = tmp_path / "root"
    shutil.copytree(root, copy, symlinks=True)
    policy = DataLake(copy).checkpoint_dir(RUN, 1) / "hf"
    (policy / "secret").symlink_to("/etc/hostname")
    out = tmp_path / "ds"
    result = CliRunner().invoke(app, ["export", RUN, "--model", "--out", str(out), "--data-root", str(copy)])
    assert result.exit_code == 2 and not out.exists()
    assert f"the policy folder {str(policy)!r} holds a link, {str(policy / 'secret')!r}" in result.stderr


def test_a_data_file_outside_the_root_names_the_variable_that_allows_it_not_the_flag(
    root, tmp_path, monkeypatch, tiny_model_dir
):
    """A run of the dataset env whose prompts file lies outside the data root: the export says the chat was left
    out, on its command line too, and names what allows both of its keys (the folder in RAGEN_TRUSTED_PATHS, the
    reward's module by --trust-env-module); doing exactly that writes the chat (the advice once named only the flag,
    and following it printed the same advice again)."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    prompts = repo / "examples" / "arithmetic" / "prompts.jsonl"
    monkeypatch.syspath_prepend(str(repo))
    monkeypatch.delenv("RAGEN_TRUSTED_PATHS", raising=False)
    from flows.train import train

    options = {"data_file": str(prompts), "reward_fn": "examples.arithmetic.reward:score", "answer_column": "solution"}
    config = {
        "model": {"path": str(tiny_model_dir)},
        "env": {"name": "dataset", "val_envs": ["dataset"], "max_turns": 1, "options": options},
        "rollout": {"env_groups": 2, "group_size": 2, "max_new_tokens": 6},
        "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
        "trainer": {"iterations": 1},
        "eval": {"every": 1, "instances": 2},
    }
    train(config, data_root=str(root), run_id="chat-dataset")
    first = CliRunner().invoke(app, ["export", "chat-dataset", "--out", str(tmp_path / "a"), "--data-root", str(root)])
    assert first.exit_code == 0, first.output
    advice = (
        f"its stored config reads a file outside the data root (env.options.data_file={json.dumps(str(prompts))}) "
        'and names code of its own (env.options.reward_fn="examples.arithmetic.reward:score"), which `ragen '
        f"export` does not use unless allowed: export again with RAGEN_TRUSTED_PATHS={prompts.parent} in the "
        "environment and `--trust-env-module` (docs/security.md)"
    )
    assert f"README.md leaves out the chat of chat-dataset: {advice}" in " ".join(first.output.split())
    assert f"Not written out: {advice}." in (tmp_path / "a" / "README.md").read_text()
    monkeypatch.setenv("RAGEN_TRUSTED_PATHS", str(prompts.parent))
    again = CliRunner().invoke(
        app,
        ["export", "chat-dataset", "--out", str(tmp_path / "b"), "--trust-env-module", "--data-root", str(root)],
    )
    assert again.exit_code == 0, again.output
    assert "leaves out" not in again.output
    readme = (tmp_path / "b" / "README.md").read_text()
    assert "## Prompting the policy of `chat-dataset`" in readme and "Not written out" not in readme
    assert readme.count("```python") == 1
