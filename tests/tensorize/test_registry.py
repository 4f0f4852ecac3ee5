"""A layer type registered by a user: tensorize, the report, layer_config checks and to_dense all follow."""

import pytest
import torch
from torch import nn

from comera_lightning import TensorizeConfig, TTLinear, tensorize, to_dense
from comera_lightning.layers import LayerSummary
from comera_lightning.tensorize import converters, registry


class ScaledLinear(nn.Module):
    """A dense layer of the user's own: ``y = s · (x Wᵀ)``."""

    def __init__(self, in_features, out_features, scale=2.0):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) / in_features**0.5)
        self.scale = scale

    def forward(self, x):
        return self.scale * (x @ self.weight.T)


class TTScaledLinear(TTLinear):
    def __init__(self, *args, scale=1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.scale = scale

    def forward(self, x):
        return self.scale * super().forward(x)

    def to_dense_module(self):
        dense = ScaledLinear(self.in_features, self.out_features, self.scale)
        with torch.no_grad():
            dense.weight.copy_(self.weight_matrix())
        return dense

    def summary(self):
        return LayerSummary("scaled", (self.in_features, self.out_features), "", self.physical_ranks)


def build(module, options):
    layer = TTScaledLinear.from_weight(module.weight.T, None, **{k: v for k, v in options.items() if k != "init"})
    layer.scale = module.scale
    return layer


@pytest.fixture
def scaled_registered(monkeypatch):
    converter = registry.Converter("scaled", build, converters.LINEAR_OPTIONS, converters.linear_defaults)
    registry.register_converter(ScaledLinear, converter)
    yield
    monkeypatch.delitem(registry._CONVERTERS, ScaledLinear)  # other tests see the registry as it was


def test_a_registered_type_is_tensorized_reported_and_exported(scaled_registered):
    torch.manual_seed(0)
    model = nn.Sequential(ScaledLinear(64, 96), nn.ReLU(), ScaledLinear(96, 64), nn.Linear(64, 2))
    x = torch.randn(3, 64)
    expected = model(x)
    report = tensorize(model, TensorizeConfig(max_rank=10_000, min_compression=0.0, target_modules=["0", "2"]))
    assert [r.kind for r in report.swapped] == ["scaled", "scaled"]
    torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)
    assert to_dense(model) == ["0", "2"] and isinstance(model[0], ScaledLinear)
    torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)


def test_per_layer_options_of_a_registered_type_are_checked(scaled_registered):
    model = nn.Sequential(ScaledLinear(64, 96), nn.ReLU(), nn.Linear(96, 2))
    with pytest.raises(ValueError, match="do not apply to 0"):
        tensorize(model, max_rank=4, target_modules=["0"], layer_config={"0": {"row_modes": [8, 8]}})


def test_register_converter_refuses_a_non_module_type():
    with pytest.raises(TypeError, match="nn.Module subclass"):
        registry.register_converter(int, None)


def test_a_broken_optional_package_does_not_stop_plain_layers_from_tensorizing(monkeypatch):
    import sys
    import types

    monkeypatch.setattr(registry, "_INTEGRATIONS", [registry._Integration("brokenpkg", "comera_lightning.tensorize.integrations.nothere", frozenset())])
    monkeypatch.setattr(registry, "_FAILED", set())
    monkeypatch.setitem(sys.modules, "brokenpkg", types.ModuleType("brokenpkg"))
    model = nn.Sequential(nn.Linear(64, 96), nn.ReLU(), nn.Linear(96, 64), nn.Linear(64, 2))
    assert tensorize(model, max_rank=4).swapped
