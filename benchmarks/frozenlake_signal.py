"""How strong is the learning signal of one FrozenLake decision? Exact numbers, no model, no sampling.

An outcome-rewarded policy learns a move from the difference it makes to the episode's return, measured against the
return's own noise. For a policy that moves at random (where RL from a format-only bootstrap starts), this computes
per map, exactly by dynamic programming over Gymnasium's transitions and the 10-action budget:

- ``Q(t, s, a) - V(t, s)``: how much one move changes the success probability, over the states the random policy
  actually visits (weighted by the probability of being there with ``t`` actions left);
- the standard deviation of the return from the map's start, ``sqrt(p (1 - p))`` (GRPO compares episodes of one
  map, so this is the noise an advantage is measured against);
- their ratio (signal to noise per decision), and the decisions per action needed to tell the best move from an
  average one at two standard errors, ``(2 sigma / delta)^2``.

Run: ``python -m benchmarks.frozenlake_signal [--maps 500] [--horizon 10]`` (seconds). docs/findings.md
("Multi-turn learning") quotes its output.
"""

from __future__ import annotations

import argparse

import numpy as np

from ragen_core.envs import make_env


def random_policy_tables(env, horizon: int) -> tuple[list[np.ndarray], np.ndarray]:
    """``Q[t][s, a]`` (success probability within ``t`` actions after ``a`` in ``s``, then random moves) for
    ``t = 1..horizon`` (index 0 unused), and the terminal-tile mask."""
    flat = "".join(env.rows)
    terminal = np.array([tile in "GH" for tile in flat])
    value = np.array([1.0 if tile == "G" else 0.0 for tile in flat])
    transitions, n_actions = env.transitions, len(env.action_names)
    tables: list[np.ndarray] = [np.zeros((len(flat), n_actions))]
    for _ in range(horizon):
        q = np.array(
            [
                [sum(p * value[nxt] for p, nxt, _, _ in transitions[s][a]) for a in range(n_actions)]
                for s in range(len(flat))
            ]
        )
        tables.append(q)
        value = np.where(terminal, value, q.mean(axis=1))
    return tables, terminal


def map_signal(env, horizon: int) -> dict[str, float]:
    """Occupancy-weighted advantage figures of the random policy on the env's current map (after ``reset``)."""
    tables, terminal = random_policy_tables(env, horizon)
    n_states, n_actions = tables[1].shape
    occupancy = np.zeros(n_states)
    start = int(env._require_lake().s)
    occupancy[start] = 1.0
    weight = best = spread = 0.0
    for t in range(horizon, 0, -1):  # t actions left
        q = tables[t]
        advantage = q - q.mean(axis=1, keepdims=True)
        live = occupancy * ~terminal
        weight += live.sum()
        best += float(live @ advantage.max(axis=1))
        spread += float(live @ np.abs(advantage).mean(axis=1))
        step = np.zeros(n_states)
        for s in np.flatnonzero(live):
            for a in range(n_actions):
                for p, nxt, _, _ in env.transitions[s][a]:
                    step[nxt] += live[s] * p / n_actions
        occupancy = step + occupancy * terminal  # finished episodes stay where they ended
    success = float(tables[horizon][start].mean())
    reached = float(occupancy["".join(env.rows).index("G")])  # the same probability, from the forward pass
    return {
        "success": success,
        "reached": reached,
        "return_std": float(np.sqrt(success * (1 - success))),
        "best_advantage": best / weight,
        "mean_abs_advantage": spread / weight,
        "decisions": weight,
    }


def signal_table(maps: int, horizon: int, slippery: bool) -> dict[str, float]:
    """Averages of :func:`map_signal` over the maps of seeds ``0..maps-1``."""
    env = make_env("frozen_lake", is_slippery=slippery)
    rows = []
    for seed in range(maps):
        env.reset(seed)
        rows.append(map_signal(env, horizon))
    mean = {key: float(np.mean([row[key] for row in rows])) for key in rows[0]}
    mean["snr"] = mean["best_advantage"] / mean["return_std"]
    mean["decisions_per_action"] = (2 * mean["return_std"] / mean["best_advantage"]) ** 2
    return mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--maps", type=int, default=500)
    parser.add_argument("--horizon", type=int, default=10)
    args = parser.parse_args()
    print(f"FrozenLake 4x4, {args.maps} maps (seeds 0..{args.maps - 1}), {args.horizon} actions, random policy")
    print(
        "| dynamics | random success | return std | best move's advantage | mean abs advantage | signal/noise "
        "| decisions per action for 2 s.e. | decisions per episode |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for slippery in (True, False):
        row = signal_table(args.maps, args.horizon, slippery)
        print(
            f"| {'slippery' if slippery else 'no slips'} | {row['success']:.3f} | {row['return_std']:.3f} "
            f"| {row['best_advantage']:.4f} | {row['mean_abs_advantage']:.4f} | {row['snr']:.3f} "
            f"| {row['decisions_per_action']:.0f} | {row['decisions']:.1f} |"
        )


if __name__ == "__main__":
    main()
