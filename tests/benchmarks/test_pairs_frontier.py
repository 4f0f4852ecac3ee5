"""benchmarks/quality/pairs_frontier: one budget end to end on a few batches of the clothing-review pairs."""

import json

import pytest

from benchmarks.quality import pairs_frontier


def test_one_budget_runs_adaptive_fixed_and_narrow_beside_dense(tmp_path):
    out = tmp_path / "pairs.json"
    result = pairs_frontier.main(["--budgets", "4", "--epochs", "2", "--limit-batches", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    runs = result["budgets"]["4"]
    assert set(runs) == {"comera", "fixed", "narrow"}
    assert runs["narrow"]["d_model"] % pairs_frontier.MODEL["num_heads"] == 0
    assert runs["narrow"]["d_model"] < pairs_frontier.MODEL["d_model"]
    assert all(run["parameters"] < result["dense"]["parameters"] for run in runs.values())
    assert "--out" not in result["command"], "no local path in the JSON"


def test_systems_and_cut_choose_what_runs(tmp_path):
    out = tmp_path / "pairs.json"
    result = pairs_frontier.main(["--budgets", "8", "--epochs", "2", "--limit-batches", "2", "--systems", "comera,fixed",
                                  "--cut", "svd", "--out", str(out)])
    assert set(result["budgets"]["8"]) == {"comera", "fixed"} and "dense" not in result
    assert result["cut"] == "svd" and result["systems"] == ["comera", "fixed"]
    assert "fixed ranks" in pairs_frontier.markdown(result) and "narrow" not in pairs_frontier.markdown(result).split("\n")[2]


@pytest.mark.parametrize("systems, problem", [("comera,wide", "unknown ['wide']"), ("narrow", "add comera")])
def test_a_wrong_system_list_is_refused_naming_it(systems, problem, capsys):
    with pytest.raises(SystemExit):
        pairs_frontier.main(["--systems", systems])
    assert problem in capsys.readouterr().err
