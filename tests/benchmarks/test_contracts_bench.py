import pytest

from benchmarks.contracts_bench import ContractsCase, measure


def test_contracts_bench_times_both_engines_on_a_passing_batch(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGEN_BENCH_CACHE", str(tmp_path / "cache"))  # the tiny model is built there, not in the repo
    result = measure(ContractsCase(groups=2, group_size=4, repeats=1))
    assert (result["trajectories"], result["turns"]) == (8, 8)  # bandit: one turn per trajectory
    seconds = result["seconds"]
    assert seconds["vectorised"]["n"] == seconds["libraries"]["n"] == 1
    # one repeat: the ratio is the two timings' quotient
    expected = seconds["libraries"]["median"] / seconds["vectorised"]["median"]
    assert result["libraries_over_vectorised"]["median"] == pytest.approx(expected)
    assert set(result["first_call_s"]) == {"vectorised", "libraries"}
