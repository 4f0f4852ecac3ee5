import pytest
import torch
from torch import nn

from comera_lightning import TTLinear, tensorize
from comera_lightning.rank import active_size, compression_stats, prune_, size_surrogate, surrogate_normalizer, tt_layers


def two_layers():
    return [TTLinear(16, 16, max_rank=4, num_cores=1), TTLinear(8, 12, max_rank=3, num_cores=(1, 2))]


def test_mean_surrogate_is_the_mean_of_masked_gates():
    layers = two_layers()
    with torch.no_grad():
        layers[0].gates[0][:2] = torch.tensor([0.5, 0.001])  # the second is dead
    gates = torch.cat([g for layer in layers for g in layer.gates])
    expected = (gates * (gates > 1e-2)).sum() / gates.numel()
    torch.testing.assert_close(size_surrogate(layers, "mean"), expected)
    assert surrogate_normalizer(layers, "mean") == gates.numel()
    torch.testing.assert_close(size_surrogate(layers, "mean", normalizer=100.0), expected * gates.numel() / 100)


def test_size_weighted_surrogate_weights_each_gate_by_the_parameters_it_controls():
    layer = TTLinear(16, 16, max_rank=4, num_cores=1)  # cores (1,16,4) and (4,16,1)
    with torch.no_grad():
        layer.gates[0].copy_(torch.tensor([1.0, 0.5, 0.0, 0.25]))
    per_index = 16 + 16
    expected = per_index * (1.0 + 0.5 + 0.25) / (per_index * 4)
    torch.testing.assert_close(size_surrogate([layer], "size"), torch.tensor(expected))


def test_surrogate_gradient_reaches_live_gates_only():
    layers = two_layers()
    with torch.no_grad():
        layers[0].gates[0][0] = 0.0
    size_surrogate(layers).backward()
    assert layers[0].gates[0].grad[0] == 0 and layers[0].gates[0].grad[1] > 0


def test_active_size_counts_core_parameters_at_active_ranks():
    layer = TTLinear(16, 16, max_rank=4, num_cores=1)
    assert int(active_size([layer])) == 16 * 4 + 4 * 16
    with torch.no_grad():
        layer.gates[0][:3] = 0
    assert int(active_size([layer])) == 16 * 1 + 1 * 16


def test_compression_stats_count_dense_equivalents():
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64), nn.Linear(64, 2))
    dense = sum(p.numel() for p in model.parameters())
    tensorize(model, max_rank=4)
    stats = compression_stats(model)
    assert stats.dense_model_parameters == dense
    assert stats.model_parameters == sum(p.numel() for p in model.parameters())
    assert stats.tt_compression > stats.model_compression > 1


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
])
def test_prune_swaps_parameters_into_the_optimizer_and_matches_the_unpruned_update(make_opt):
    torch.manual_seed(0)
    model = nn.Sequential(TTLinear(16, 16, max_rank=6, num_cores=2, dtype=torch.float64))
    reference = nn.Sequential(TTLinear(16, 16, max_rank=6, num_cores=2, dtype=torch.float64))
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        for m in (model, reference):
            m[0].gates[1][[0, 2]] = 0.0  # dead from the start: no gradient, no momentum
    opt, ref_opt = make_opt(model.parameters()), make_opt(reference.parameters())
    x = torch.randn(32, 16, dtype=torch.float64)
    for _ in range(3):
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    summary = prune_(model, [opt])
    assert summary.removed > 0 and summary.ranks["0"][1] == 4
    assert all(any(p is q for g in opt.param_groups for q in g["params"]) for p in model.parameters())
    for m, o in ((model, opt), (reference, ref_opt)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
    torch.testing.assert_close(model(x), reference(x), atol=1e-10, rtol=0)


def test_prune_without_optimizer_and_tt_layers_listing():
    model = nn.Sequential(TTLinear(16, 16, max_rank=4, num_cores=1), nn.ReLU())
    with torch.no_grad():
        model[0].gates[0][0] = 0
    model(torch.randn(2, 16)).sum().backward()
    prune_(model)
    assert [n for n, _ in tt_layers(model)] == ["0"] and model[0].physical_ranks == (3,)
    model(torch.randn(2, 16)).sum().backward()  # fresh parameters: no stale autograd state


def test_backward_after_prune_while_an_old_graph_is_still_alive():
    # Regression: resizing via `param.data = ...` kept autograd's cached accumulator with the old
    # shape, so any graph alive across a prune (e.g. held by a reference cycle) broke the next backward.
    layer = TTLinear(16, 16, max_rank=4, num_cores=1)
    x = torch.randn(3, 16)
    old_graph = layer(x).sum()
    with torch.no_grad():
        layer.gates[0][:2] = 0
    prune_(layer)
    layer(x).sum().backward()
    assert layer.gates[0].grad.shape == (2,)
    del old_graph


def test_a_nan_gate_is_never_counted_as_dead():
    from comera_lightning.rank import prune_

    layer = TTLinear(16, 16, max_rank=4)
    with torch.no_grad():
        layer.gates[0][0] = float("nan")
        layer.gates[0][1] = 0.0
    assert layer.gate_masks()[0].tolist()[:2] == [True, False]
    prune_(layer)
    assert torch.isnan(layer.gates[0]).any(), "the NaN gate was kept, so the fault shows in the outputs"
    assert torch.isnan(layer(torch.randn(2, 16))).any()


def test_a_layer_with_a_dead_bond_keeps_every_parameter_and_its_input_in_the_graph():
    from comera_lightning.rank import prune_

    torch.manual_seed(0)
    first, dead = nn.Linear(16, 16), TTLinear(16, 16, max_rank=4)
    with torch.no_grad():
        dead.gates[1].zero_()
    prune_(dead)
    x = torch.randn(3, 16)
    y = dead(first(x).half().float())
    torch.testing.assert_close(y, dead.bias.expand(3, 16))
    y.sum().backward()
    assert all(p.grad is not None for p in [*first.parameters(), *dead.parameters()]), "DDP needs every parameter used"
    assert all(float(p.grad.abs().sum()) == 0 for p in [*first.parameters(), *dead.cores])


@pytest.mark.parametrize("make", [
    lambda vocab: __import__("comera_lightning").TTEmbedding(vocab, 16, max_rank=4),
    lambda width: TTLinear(width, 32, bias=False, max_rank=4),
])
def test_a_state_of_another_shape_fails_at_load_naming_the_layer(make):
    source, target = nn.Sequential(make(600)), nn.Sequential(make(400))
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"0: the checkpoint's core \d has mode axes .* build the model with the checkpoint's sizes"):
        target.load_state_dict(source.state_dict())
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items()), "nothing was changed"
