"""The paper's three optimizer param groups: cores, gates, everything else (comera_param_groups)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from comera_lightning.models import SentencePairClassifier
from comera_lightning.optim.param_groups import comera_param_groups, param_group_of

TINY = dict(vocab_size=50, d_model=32, num_layers=2, num_heads=4, d_ff=64, max_positions=16)


def tiny_classifier(**overrides) -> SentencePairClassifier:
    return SentencePairClassifier(**{**TINY, "dropout": 0.0, **overrides})


class FakeTT(nn.Module):
    """Parameter naming of a TT layer: ``cores`` and ``gates`` ParameterLists plus a bias."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.cores = nn.ParameterList([nn.Parameter(torch.randn(1, 4, 3)), nn.Parameter(torch.randn(3, 8, 1))])
        self.gates = nn.ParameterList([nn.Parameter(torch.ones(3))])
        self.bias = nn.Parameter(torch.zeros(n))
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.einsum("aib,bjc->ij", self.cores[0] * self.gates[0], self.cores[1])
        return x @ w.reshape(self.n, -1) + self.bias


def _ids(params) -> list[int]:
    return [id(p) for p in params]


def test_param_groups_cover_every_parameter_once():
    model = tiny_classifier()
    groups = comera_param_groups(model)
    assert [g["name"] for g in groups] == ["other"]  # no TT layers: empty groups are omitted
    ids = [i for g in groups for i in _ids(g["params"])]
    assert sorted(ids) == sorted(_ids(model.parameters()))
    assert len(ids) == len(set(ids))
    assert groups[0]["lr"] == 5e-5 and groups[0]["weight_decay"] == 0.0


def test_param_groups_route_cores_and_gates():
    torch.manual_seed(0)
    model = tiny_classifier()
    model.backbone.encoder.layers[0].attention.query = FakeTT(32)
    model.backbone.encoder.layers[1].ffn.intermediate = FakeTT(64)
    model.backbone.encoder.layers[1].ffn.intermediate.cores[1] = nn.Parameter(torch.randn(3, 16, 1))
    model.classifier.weight.requires_grad_(False)  # frozen parameters are skipped
    model.pooler.extra = nn.Linear(1, 1)
    model.pooler.extra.weight = model.pooler.weight  # a tied (shared) parameter appears once

    groups = comera_param_groups(model, lr_cores=1.0, lr_gates=2.0, lr_other=3.0, weight_decay=0.1)
    by_name = {g["name"]: g for g in groups}
    assert list(by_name) == ["cores", "gates", "other"]
    assert (by_name["cores"]["lr"], by_name["gates"]["lr"], by_name["other"]["lr"]) == (1.0, 2.0, 3.0)
    assert by_name["gates"]["weight_decay"] == 0.0
    assert by_name["cores"]["weight_decay"] == by_name["other"]["weight_decay"] == 0.1
    own = {g["name"]: g["weight_decay"] for g in comera_param_groups(model, weight_decay=0.1, core_weight_decay=0.0)}
    assert own == {"cores": 0.0, "gates": 0.0, "other": 0.1}

    names = {id(p): n for n, p in model.named_parameters()}
    for group in groups:
        for p in group["params"]:
            assert param_group_of(names[id(p)]) == group["name"]
    assert len(by_name["cores"]["params"]) == 4 and len(by_name["gates"]["params"]) == 2
    ids = [i for g in groups for i in _ids(g["params"])]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert sorted(ids) == sorted(_ids(trainable)) and len(ids) == len(set(ids))

    assert param_group_of("a.cores.0") == "cores" and param_group_of("a.gates.1") == "gates"
    assert param_group_of("encoder.my_cores_layer.weight") == "other"  # whole components only


def test_param_groups_reject_bad_values():
    with pytest.raises(ValueError, match="lr_gates"):
        comera_param_groups(nn.Linear(2, 2), lr_gates=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        comera_param_groups(nn.Linear(2, 2), weight_decay=-1.0)
    with pytest.raises(ValueError, match="core_weight_decay"):
        comera_param_groups(nn.Linear(2, 2), core_weight_decay=-1.0)
