"""benchmarks/quality/baselines: activation-aware and Fisher-weighted SVD, magnitude pruning, on plain layers."""

import pytest
import torch
from torch import nn

from benchmarks.quality.baselines import (activation_scales, asvd_factors_, distilled_, distilled_output_, fisher_scales,
                                         fwsvd_factors_, kept_weights, kfac_factors_, kfac_statistics, magnitude_prune_,
                                         measured_ranks, nonzero_parameters)
from benchmarks.quality.models import svd_factors_, svd_ranks_of, uniform_ranks_of
from comera_lightning import TensorizeConfig
from comera_lightning.rank import tt_layers
from comera_lightning.tensorize import tensorize


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def copies(net: Net, count: int) -> list[Net]:
    """``count`` fresh ``Net``s holding ``net``'s weights."""
    fresh = [Net() for _ in range(count)]
    for copy in fresh:
        copy.load_state_dict(net.state_dict())
    return fresh


def test_asvd_at_full_rank_is_exact_and_at_low_rank_favours_the_inputs_the_data_uses():
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(64, 16) * torch.cat([torch.full((4,), 10.0), torch.full((12,), 0.1)])  # 4 inputs carry the data
    scales = activation_scales(net, ["first"], [{"x": x}])
    assert scales["first"][:4].min() > 5 * scales["first"][4:].max()
    (exact,) = copies(net, 1)
    asvd_factors_(exact, {"first": 16}, scales)
    torch.testing.assert_close(exact.first(x), net.first(x), rtol=1e-4, atol=1e-4)
    plain, aware = copies(net, 2)
    svd_factors_(plain, {"first": 4})
    asvd_factors_(aware, {"first": 4}, scales)
    target = net.first(x)
    assert (aware.first(x) - target).norm() < 0.5 * (plain.first(x) - target).norm()


def test_fwsvd_at_full_rank_is_exact_and_at_low_rank_favours_the_outputs_the_loss_reads():
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():
        net.second.weight[:, 4:] = 0  # the loss reads 4 of the first layer's 32 outputs
    x = torch.randn(64, 16)
    scales = fisher_scales(net, ["first", "second"], [x], lambda model, batch: model(batch).pow(2).mean())
    assert scales["first"][:4].min() > 100 * scales["first"][4:].max() and set(scales) == {"first", "second"}
    (exact,) = copies(net, 1)
    fwsvd_factors_(exact, {"first": 16}, scales)
    torch.testing.assert_close(exact.first(x), net.first(x), rtol=1e-4, atol=1e-4)
    assert all(p.grad is None for p in net.parameters()), "the gradients taken are cleared"
    plain, aware = copies(net, 2)
    svd_factors_(plain, {"first": 4})
    fwsvd_factors_(aware, {"first": 4}, {"first": scales["first"]})
    target = net.first(x)[:, :4]
    assert (aware.first(x)[:, :4] - target).norm() < 0.5 * (plain.first(x)[:, :4] - target).norm()


def test_kfac_svd_at_full_rank_is_exact_and_at_low_rank_loses_less_of_the_loss_than_plain_svd():
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():
        net.second.weight[:, 4:] = 0  # the loss reads 4 of the first layer's 32 outputs
    x = torch.randn(256, 16) * torch.cat([torch.full((4,), 10.0), torch.full((12,), 0.1)])  # and 4 inputs carry the data
    loss_of = lambda model, batch: model(batch).pow(2).mean()
    statistics = kfac_statistics(net, ["first"], [x], loss_of)
    inputs, gradients = statistics["first"]
    assert inputs.shape == (16, 16) and gradients.shape == (32, 32) and gradients[4:, 4:].abs().max() == 0
    assert all(p.grad is None for p in net.parameters()), "the gradients taken are cleared"
    (exact,) = copies(net, 1)
    kfac_factors_(exact, {"first": 16}, statistics)
    torch.testing.assert_close(exact.first(x), net.first(x), rtol=1e-3, atol=1e-3)
    plain, aware = copies(net, 2)
    svd_factors_(plain, {"first": 3})
    kfac_factors_(aware, {"first": 3}, statistics)
    dense = loss_of(net, x).detach()
    assert (loss_of(aware, x) - dense).abs() < 0.5 * (loss_of(plain, x) - dense).abs()


def test_measured_ranks_spend_the_weights_where_cutting_costs_the_loss_most():
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(256, 16) * torch.cat([torch.ones(4), torch.full((12,), 1e-3)])  # the first layer needs rank 4 at most
    target = net(x).detach() + 0.01 * torch.randn(256, 8)  # a model trained to about its data's noise
    loss_of = lambda model, batch: (model(batch) - target).pow(2).mean()
    statistics = kfac_statistics(net, ["first", "second"], [x], loss_of)
    before = {name: p.clone() for name, p in net.state_dict().items()}
    weights = kept_weights({"first": 6, "second": 6}, net)
    ranks = measured_ranks(net, statistics, weights, [x], loss_of)
    assert kept_weights(ranks, net) <= weights and ranks["second"] == 8 > 6 > ranks["first"] >= 4
    assert all(torch.equal(before[name], p) for name, p in net.state_dict().items()), "the model is given back as it was"
    assert net.training, "and in the mode it was in"


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(5, 3)

    def forward(self, ids):
        return self.table(ids)


def test_kfac_statistics_of_a_token_table_are_its_rows_frequencies_and_its_truncation_keeps_the_frequent_rows():
    torch.manual_seed(0)
    model, ids = Tokens(), torch.tensor([[0, 0, 1, 4]])
    inputs, gradients = kfac_statistics(model, ["table"], [ids], lambda m, batch: m(batch).sum())["table"]
    torch.testing.assert_close(inputs, torch.tensor([0.5, 0.25, 0.0, 0.0, 0.25]), msg="the diagonal only, as a vector")
    torch.testing.assert_close(gradients, torch.ones(3, 3))
    dense = torch.tensor([[1.0, 0, 0], [0, 0.1, 0], [0, 0, 5.0], [0, 0, 4.0], [0, 0.1, 0.1]])  # the largest rows never seen
    plain, aware = Tokens(), Tokens()
    for tokens in (plain, aware):
        tokens.table.weight.data.copy_(dense)
    svd_factors_(plain, {"table": 1})
    kfac_factors_(aware, {"table": 1}, {"table": (inputs, torch.eye(3))})
    assert type(aware.table).__name__ == "LowRankEmbedding"
    torch.testing.assert_close(aware(torch.tensor([0])), dense[:1], rtol=1e-4, atol=1e-4, msg="the most frequent row kept")
    assert plain(torch.tensor([0])).norm() < 1e-4, "where the plain SVD keeps the largest rows"


def test_magnitude_pruning_keeps_the_weights_asked_for():
    torch.manual_seed(0)
    net = Net()
    keep = kept_weights({"first": 2, "second": 2}, net)
    assert keep == 2 * (16 + 32) + 2 * (32 + 8)
    magnitude_prune_(net, ["first", "second"], keep)
    biases = 32 + 8
    assert nonzero_parameters(net) == keep + biases
    assert int((net.first.weight != 0).sum() + (net.second.weight != 0).sum()) == keep


class Classifier(Net):
    """``Net`` as a LightningModule would hold it: a training_step calling forward."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)


def test_the_plain_path_with_a_teacher_distils_the_dense_model_it_was_factored_from():
    torch.manual_seed(0)
    model, batch = Classifier(), (torch.randn(32, 16), torch.randint(0, 8, (32,)))
    dense = model(batch[0]).detach()
    distilled_(model, {"module": "", "weight": 1.0})  # the task loss wholly replaced by the teacher's term
    svd_factors_(model, {"first": 2, "second": 2})
    student = model(batch[0])
    expected = nn.functional.kl_div(student.log_softmax(-1), dense.log_softmax(-1), log_target=True, reduction="batchmean")
    torch.testing.assert_close(model.training_step(batch, 0), expected)


def test_a_hugging_face_models_loss_becomes_the_objective_with_its_trained_copy_as_teacher():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, 32, (2, 8))
    dense = model(input_ids=ids).logits.detach()
    distilled_output_(model, {"module": "model", "weight": 0.5})  # the whole model teaches, whatever module CoMERA had
    with torch.no_grad():
        model.lm_head.weight.mul_(0.5)  # the student moves away from its teacher
    out = model(input_ids=ids, labels=ids)
    task = model.loss_function(out.logits, ids, vocab_size=32)
    kl = nn.functional.kl_div(out.logits.reshape(-1, 32).log_softmax(-1), dense.reshape(-1, 32).log_softmax(-1),
                              log_target=True, reduction="batchmean")
    torch.testing.assert_close(out.loss, 0.5 * task + 0.5 * kl)
    model.eval()
    torch.testing.assert_close(model(input_ids=ids, labels=ids).loss, task, msg="evaluation keeps the task loss")


def test_the_uniform_plain_path_gives_every_layer_one_rank_at_the_tensorized_layers_total_size():
    net = Net()
    ranks = {"first": {"max_rank": 6}, "second": {"max_rank": 2}}
    tensorize(net, TensorizeConfig(target_modules=["first", "second"], layer_config=ranks, min_compression=1.0))
    per_layer, uniform = svd_ranks_of(net), uniform_ranks_of(net)
    assert per_layer == {"first": 6, "second": 2} and uniform == {"first": 4, "second": 4}
    cores = sum(core.numel() for _, layer in tt_layers(net) for core in layer.cores)
    assert abs(4 * (16 + 32 + 32 + 8) - cores) <= (16 + 32 + 32 + 8) / 2, "the same total, to one rank"
