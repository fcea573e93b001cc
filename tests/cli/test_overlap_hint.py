"""An async run on a machine that cannot overlap its two lanes says so before it starts (issue 66: a new user on a
loaded 2-core machine measured 0.89x where docs/async.md reports 0.61x, and nothing told them why): the note names
the threads each lane asks for and the free cores, and what to set."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ragen_cli.launch import overlap_hint
from ragen_cli.main import app
from ragen_core.config import RunConfig


def _config(**keys) -> RunConfig:
    trainer = {"max_staleness": keys.pop("staleness", 1), "num_threads": keys.pop("num_threads", 1)}
    rollout = {"sampler_threads": keys.pop("sampler_threads", 1), "backend": keys.pop("backend", "hf")}
    return RunConfig.model_validate({"trainer": trainer, "rollout": rollout})


@pytest.mark.parametrize(
    ("config", "cores", "load", "says"),
    [
        (_config(), 2, 0.0, None),  # one thread a lane on 2 idle cores: the finding's setting
        (_config(), 2, 0.4, None),  # 1.6 free: within half a core of noise
        (_config(), 2, 1.0, "2 threads, and this machine has 1.0 free core(s) of 2 (one-minute load 1.0)"),
        (_config(num_threads=2), 2, 0.0, "3 threads, and this machine has 2.0 free core(s) of 2 (one-minute"),
        (_config(num_threads=None), 4, 0.0, "(trainer.num_threads=torch default, 4) and the sampler process"),
        (_config(num_threads=None, sampler_threads=3), 8, 3.0, "11 threads"),  # 5 free: 8 + 3 do not fit
        (_config(staleness=0, num_threads=2), 1, 1.0, None),  # synchronous: one lane
        (_config(backend="vllm", num_threads=2), 2, 1.0, None),  # the server samples on cores of its own
    ],
)
def test_the_note_says_when_the_lanes_need_more_cores_than_are_free(config, cores, load, says):
    hint = overlap_hint(config, cores, load)
    if says is None:
        assert hint is None
    else:
        assert says in hint and "trainer.num_threads=1 with rollout.sampler_threads=1" in hint


@pytest.mark.server  # a ragen train with its own Prefect server
def test_ragen_train_prints_the_note_on_stderr_before_the_run(tmp_path, tiny_model_dir):
    """64 learner threads fit no machine this runs on: the note comes first, on stderr, and the run goes on."""
    args = [
        "train",
        "--data-root",
        str(tmp_path / "root"),
        f"model.path={tiny_model_dir}",
        "trainer.iterations=1",
        "trainer.max_staleness=1",
        "trainer.num_threads=64",
        "rollout.env_groups=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "actor.mini_batch_size=4",
        "actor.micro_batch_size=4",
        "eval.instances=2",
        "monitor.truncated_share=null",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("note: trainer.max_staleness=1")]
    assert len(lines) == 1 and "(trainer.num_threads=64)" in lines[0] and "65 threads" in lines[0]
