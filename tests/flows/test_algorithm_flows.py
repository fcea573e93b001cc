"""The algorithm switches of StarPO through the real flow: critic (GAE, bi-level GAE with per-turn rewards), KL in
the loss or in the reward, dual-clip, Online-k, the filters; the filter's stored decisions checked in DuckDB."""

import re
from pathlib import Path

import numpy as np
import pytest

from ragen_core.config import build_config
from ragen_core.storage import query

BASE = {
    "rollout": {"env_groups": 4, "group_size": 4, "max_new_tokens": 8},
    "env": {"val_envs": ["bandit"]},
    "actor": {"mini_batch_size": 4, "micro_batch_size": 4},
    "trainer": {"iterations": 1},
    "eval": {"every": 1, "instances": 2},
}
MULTI_TURN = {"name": "sokoban", "val_envs": ["sokoban"], "max_turns": 3, "max_actions_per_turn": 2}
VARIANTS = {
    "gae": {"algorithm": {"preset": "starpo", "adv_estimator": "gae"}},
    "bilevel": {
        "algorithm": {"adv_estimator": "bi_level_gae", "reward_level": "turn", "filter_ratio": 1.0},
        "env": {**MULTI_TURN, "max_actions_per_traj": 4},
    },
    "kl_reward": {
        "algorithm": {"adv_estimator": "rloo", "kl_coef": 0.01, "kl_mode": "reward", "policy_loss": "dual_clip"}
    },
    "kl_think": {"algorithm": {"kl_coef": 0.01, "kl_span": "think"}},  # the anchor on the thinking only
    "online3": {"algorithm": {"adv_estimator": "reinforce_plus_plus"}, "actor": {"online_k": 3}},
    "std_half": {"algorithm": {"filter": "std", "filter_ratio": 0.5, "adv_estimator": "reinforce_plus_plus_baseline"}},
    "top_p": {"algorithm": {"filter": "std_top_p", "filter_ratio": 0.6}},
    # RAGEN-2's strategies over each metric (replayed in SQL below)
    "softmax": {"algorithm": {"filter": "top_p", "filter_top_p_mode": "softmax", "filter_ratio": 0.5}},
    "min_p_length": {"algorithm": {"filter": "min_p", "filter_metric": "length", "filter_ratio": 0.9}},
    "abs_entropy": {
        "algorithm": {"filter": "top_k_abs", "filter_ratio": 2, "filter_metric": "entropy", "filter_largest": False}
    },
    "reward_nonzero": {
        "algorithm": {"filter": "top_k", "filter_ratio": 0.5, "filter_metric": "reward", "filter_include_zero": False}
    },
    # RAGEN-2's entropy_variance over the full-distribution entropy; its preset with both advantage scalings
    "entropy_var_full": {
        "algorithm": {
            "filter": "top_k",
            "filter_ratio": 0.5,
            "filter_metric": "entropy_variance",
            "filter_entropy": "full",
        }
    },
    "ragen2": {"algorithm": {"preset": "ragen2", "soft_advantage_reweight": True, "filter_loss_scaling": "linear"}},
}


def _merge(base, extra):
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, values in extra.items():
        out[section] = {**out.get(section, {}), **values}
    return out


@pytest.fixture(scope="module")
def lake_root(prefect_harness, tmp_path_factory, tiny_model_dir):
    from flows.train import train

    root = tmp_path_factory.mktemp("algorithms")
    for name, extra in VARIANTS.items():
        config = build_config(_merge({**BASE, "model": {"path": str(tiny_model_dir)}}, extra))
        train(config.to_dict(), data_root=str(root), run_id=name)
    return root


def _metrics(root, run_id):
    rows = query(root, f"SELECT name, value FROM metrics WHERE run_id = '{run_id}' AND iteration = 0").to_pylist()
    return {r["name"]: r["value"] for r in rows}


def test_critic_runs_report_value_metrics(lake_root):
    for run_id in ("gae", "bilevel"):
        metrics = _metrics(lake_root, run_id)
        assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/vf_explained_var", "critic/grad_norm"} <= set(metrics)
    assert "critic/vf_loss" not in _metrics(lake_root, "kl_reward")


def test_kl_as_loss_and_as_reward(lake_root):
    assert "actor/kl_loss" in _metrics(lake_root, "gae")  # vanilla StarPO: KL 0.001 as a loss term
    kl_reward = _metrics(lake_root, "kl_reward")
    assert "actor/reward_kl" in kl_reward and "actor/kl_loss" not in kl_reward
    assert "actor/clipfrac_dual" in kl_reward
    assert np.isfinite(_metrics(lake_root, "kl_think")["actor/kl_loss"])  # kl_span=think through the updater


def test_online_k_steps(lake_root):
    assert _metrics(lake_root, "online3")["actor/optimizer_steps"] == 3
    # default: one pass over the kept rows in mini-batches of 4 (filter 0.25 of 4 groups keeps 1 group = 4 rows)
    assert _metrics(lake_root, "kl_reward")["actor/optimizer_steps"] == 1


def test_every_iteration_records_the_reference_metrics(lake_root):
    metrics = _metrics(lake_root, "gae")
    expected = {
        "rollout/success_rate",
        "rollout/reward_mean",
        "rollout/reward_std",
        "rollout/in_group_reward_std",
        "filter/kept_in_group_std",
        "rollout/response_length",
        "rollout/actions_per_traj",
        "rollout/valid_action_rate",
        "rollout/format_error_rate",
        "rollout/group_pass_rate",
        "rollout/think_distinct_rate",
        "actor/pg_loss",
        "actor/clipfrac_upper",
        "actor/clipfrac_lower",
        "actor/ppo_kl",
        "actor/entropy",
        "actor/grad_norm",
        "actor/lr",
        "critic/vf_loss",
        "critic/vf_explained_var",
        "time/generate",
        "time/update",
        "time/generate_tokens_per_s",
        "time/update_tokens_per_s",
        "val/bandit/success",
        "val/bandit/pass@k",
        "perf/model_tflop",
        "perf/mfu",
    }
    assert expected <= set(metrics), expected - set(metrics)


FILTER_CHECK = """
WITH g AS (
    SELECT run_id, iteration, group_id, coalesce(stddev_samp(total_reward), 0) AS std,
           bool_and(kept) AS all_kept, bool_or(kept) AS any_kept, max(group_reward_std) AS stored
    FROM trajectories WHERE split = 'train' AND run_id IN ('std_half', 'gae', 'kl_reward') GROUP BY ALL
), ranked AS (
    SELECT *, row_number() OVER (PARTITION BY run_id, iteration ORDER BY std DESC, group_id) AS rank,
           count(*) OVER (PARTITION BY run_id, iteration) AS groups
    FROM g
)
SELECT run_id, group_id, std, stored, all_kept, rank,
       greatest(1, floor(CASE run_id WHEN 'std_half' THEN 0.5 WHEN 'gae' THEN 1.0 ELSE 0.25 END * groups))::INT AS keep
FROM ranked
"""


def test_filter_decisions_agree_with_a_duckdb_recomputation(lake_root):
    rows = query(lake_root, FILTER_CHECK).to_pylist()
    assert {r["run_id"] for r in rows} == {"std_half", "gae", "kl_reward"} and len(rows) == 12
    for row in rows:
        assert row["stored"] == pytest.approx(row["std"], abs=1e-9)
        assert row["all_kept"] == (row["rank"] <= row["keep"]), row  # the gae run uses the starpo preset: no filter
    kept = {run: sum(r["all_kept"] for r in rows if r["run_id"] == run) for run in ("std_half", "gae", "kl_reward")}
    assert kept == {"std_half": 2, "gae": 4, "kl_reward": 1}


def test_top_p_filter_covers_the_share_of_total_std(lake_root):
    rows = query(
        lake_root,
        "SELECT group_id, max(group_reward_std) AS std, bool_and(kept) AS kept FROM trajectories "
        "WHERE run_id = 'top_p' AND split = 'train' GROUP BY 1 ORDER BY std DESC, group_id",
    ).to_pylist()
    total = sum(r["std"] for r in rows)
    kept = [r for r in rows if r["kept"]]
    assert kept == rows[: len(kept)]  # kept in descending std
    target = 0.6 * total - 0.01  # RAGEN's linear top-p: 60% of the total std, less its 0.01 slack
    if target > 0:
        covered = sum(r["std"] for r in kept)
        assert covered >= target - 1e-12
        assert covered - kept[-1]["std"] < target  # the smallest prefix that covers it
    else:
        assert kept == []  # no group is needed to reach a target <= 0: RAGEN keeps nothing, the update is skipped


def _replay_query() -> str:
    text = (Path(__file__).resolve().parents[2] / "docs" / "algorithms.md").read_text()
    block = re.search(r"<!-- filter-replay:begin -->\n```sql\n(.*?)```\n<!-- filter-replay:end -->", text, re.S)
    assert block, "docs/algorithms.md lost its filter replay query"
    return block.group(1)


def test_the_documented_sql_replays_every_filter_decision(lake_root):
    """docs/algorithms.md's query recomputes each group's decision from the stored metric values and the run's
    config, for every strategy, metric and direction trained above: it must agree with what the filter stored."""
    rows = query(lake_root, _replay_query()).to_pylist()
    assert {r["run_id"] for r in rows} == set(VARIANTS)
    for row in rows:
        assert row["replayed"] == row["kept"], row
    by_run = {run: [r["kept"] for r in rows if r["run_id"] == run] for run in VARIANTS}
    assert sum(by_run["abs_entropy"]) == 2  # top_k_abs 2 of 4 groups, by hand
    assert sum(by_run["std_half"]) == 2 and sum(by_run["gae"]) == 4
    values = {r["group_id"]: r["metric_value"] for r in rows if r["run_id"] == "min_p_length"}
    kept = {r["group_id"] for r in rows if r["run_id"] == "min_p_length" and r["kept"]}
    assert kept == {g for g, v in values.items() if v >= 0.9 * max(values.values())}  # min_p by hand


def test_full_entropy_filter_ranks_the_policys_distribution_entropy(lake_root, tiny_model_dir):
    """The entropy_variance filter with filter_entropy=full stored, per group, the std of the trajectories' mean
    full-distribution entropy under the policy that sampled them (the start model: iteration 0 is before any
    update), recomputed here with a plain forward and softmax."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    rows = query(
        lake_root,
        "SELECT group_id, input_ids, loss_mask, filter_metric_value, kept FROM trajectories "
        "WHERE run_id = 'entropy_var_full' AND split = 'train' ORDER BY group_id, traj_index",
    ).to_pylist()
    per_group: dict[int, list[float]] = {}
    for row in rows:
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([row["input_ids"]])).logits[0].double(), dim=-1)
        entropy = -(logp.exp() * logp).sum(dim=-1)  # (T,) entropy of the distribution predicting token t + 1
        trained = [t for t, m in enumerate(row["loss_mask"]) if m and t > 0]
        per_group.setdefault(row["group_id"], []).append(float(entropy[[t - 1 for t in trained]].mean()))
    for row in rows:  # the run's forward is in float32: entropies near log(vocab) agree to ~1e-7
        assert row["filter_metric_value"] == pytest.approx(np.std(per_group[row["group_id"]], ddof=1), abs=2e-6)
    ranked = sorted(per_group, key=lambda g: (-float(np.std(per_group[g], ddof=1)), g))
    assert {r["group_id"] for r in rows if r["kept"]} == set(ranked[:2])  # top_k 0.5 of 4 groups


def test_ragen2_preset_scales_the_advantages_by_the_kept_share(lake_root):
    metrics = _metrics(lake_root, "ragen2")
    groups = query(
        lake_root,
        "SELECT count(DISTINCT group_id) AS n, count(DISTINCT group_id) FILTER (WHERE kept) AS kept "
        "FROM trajectories WHERE run_id = 'ragen2' AND split = 'train'",
    ).to_pylist()[0]
    if groups["kept"] == 0:
        assert metrics.get("actor/skipped_update") == 1.0  # top_p over zero-std groups excluded: nothing to train
    else:
        assert metrics["actor/filter_loss_scale"] == pytest.approx(groups["kept"] / groups["n"])
        assert metrics["actor/soft_reweight_max"] == pytest.approx(1.0, abs=1e-5)  # the largest kept std over itself
