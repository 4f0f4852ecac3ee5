"""Rules that match nothing: the error lists the modules that can be tensorized, closest first."""

from __future__ import annotations

import pytest
from torch import nn

from comera_lightning import TensorizeConfig, tensorize
from comera_lightning.tensorize import RuleMatchError, check_rules, tensorizable_names
from comera_lightning.tensorize.rules import closest_names, group_indices


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.query = nn.Linear(64, 64)
        self.ffn = nn.Linear(64, 256)
        self.norm = nn.LayerNorm(64)  # no converter: never a candidate


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        self.blocks = nn.ModuleList([Block(), Block(), Block()])
        self.frozen = nn.Linear(64, 64).requires_grad_(False)  # frozen: cannot be tensorized
        self.classifier = nn.Linear(64, 3)  # an output head: tensorized when a rule names it


def _listed(err: pytest.ExceptionInfo[RuleMatchError]) -> list[str]:
    return str(err.value).split("closest first: ")[1].split(". ")[0].split(" (and")[0].split(", ")


def test_candidates_are_the_modules_tensorize_can_swap():
    names = tensorizable_names(Model())
    assert "blocks.0.query" in names and "classifier" in names and "embed" in names
    assert not [n for n in names if "norm" in n or n == "frozen"]


@pytest.mark.parametrize("rules, first", [
    (dict(target_modules=["querry"]), "blocks.{0..2}.query"),
    (dict(target_modules=["embedding"]), "embed"),
    (dict(exclude_modules=["blocks.1.fn"]), "blocks.{0..2}.ffn"),
    (dict(target_modules=["norm"]), None),  # names a LayerNorm: found, but nothing tensorize can swap
])
def test_a_rule_matching_nothing_lists_the_candidates_closest_first(rules, first):
    model = Model()
    with pytest.raises(RuleMatchError, match=r"entries \[.*\] match no module of Model that can be tensorized; candidates, closest first") as err:
        tensorize(model, **rules)
    listed = _listed(err)
    assert set(listed) == {"embed", "blocks.{0..2}.query", "blocks.{0..2}.ffn", "classifier"}
    if first is not None:
        assert listed[0] == first
    assert isinstance(model.blocks[0].query, nn.Linear), "a failed tensorize leaves the model as it was"


def test_check_rules_finds_a_name_that_is_nowhere_without_building_anything():
    model = Model()
    check_rules(model, TensorizeConfig(target_modules=["query", "norm"], exclude_modules=["blocks.0.query"]))
    with pytest.raises(RuleMatchError, match=r"target_modules entries \['quey'\].*closest first: blocks\.\{0\.\.2\}\.query"):
        check_rules(model, TensorizeConfig(target_modules=["quey"]))
    with pytest.raises(RuleMatchError, match=r"exclude_modules entries \['zzz\.\*'\]"):
        check_rules(model, TensorizeConfig(exclude_modules="zzz.*"))
    assert isinstance(model.blocks[0].query, nn.Linear) and not any(p.grad is not None for p in model.parameters())


def test_names_differing_in_one_index_are_written_once_and_ranked_by_their_closest_suffix():
    names = ["embed", "layers.0.q", "layers.1.q", "layers.2.q", "layers.0.kv", "layers.2.kv", "a.0.b.1", "a.1.b.0"]
    assert group_indices(names) == ["embed", "layers.{0..2}.q", "layers.{0,2}.kv", "a.0.b.1", "a.1.b.0"]
    assert closest_names(["k"], ["embed", "layers.{0..2}.q", "layers.{0,2}.kv"])[0] == "layers.{0,2}.kv"
    assert closest_names(["embedding"], ["layers.{0..2}.q", "embed"])[0] == "embed"
