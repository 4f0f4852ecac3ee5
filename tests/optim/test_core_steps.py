"""CoreStepScale on its own (plain torch) and under the callback with the module's own optimizer: one scale for every
layer, or the default rule (vocabulary layers' cores stretched, every other layer's left alone)."""

import copy

import lightning as L
import pytest
import torch
from torch import nn

from comera_lightning import ComeraCallback, TensorizeConfig, tensorize
from comera_lightning.layers import TTLinear
from comera_lightning.optim.core_steps import (TRAINED_VOCABULARY_STEP_SCALE, VOCABULARY_STEP_SCALE, CoreStepScale,
                                               is_vocabulary_layer)
from comera_lightning.rank import prune_, tt_layers
from comera_lightning.schedule import BudgetConfig
from tests.helpers.callback_runs import trainer
from tests.helpers.plain_modules import PlainClassifier, loaders


def tensorized():
    torch.manual_seed(0)
    model = PlainClassifier()
    tensorize(model, max_rank=8, num_cores=3)
    return model


def cores_of(model):
    return [core for _, layer in tt_layers(model) for core in layer.cores]


def layers_of(model):
    return [layer for _, layer in tt_layers(model)]


def one_step(model, optimizer):
    torch.manual_seed(1)
    optimizer.zero_grad()
    model(torch.randn(8, 64)).pow(2).mean().backward()
    optimizer.step()


@pytest.mark.parametrize("make, scaled_steps", [(lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1), 3.0),
                                                (lambda p: torch.optim.Adagrad(p, lr=1e-2), 3.0),
                                                (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 1.0)])
def test_adam_like_steps_on_cores_are_scaled_and_nothing_else_changes(make, scaled_steps):
    plain, scaled = tensorized(), tensorized()
    start = copy.deepcopy(plain.state_dict())
    plain_opt, scaled_opt = make(plain.parameters()), make(scaled.parameters())
    CoreStepScale(3.0).attach(layers_of(scaled), [scaled_opt])
    one_step(plain, plain_opt)
    one_step(scaled, scaled_opt)
    core_names = {n for n, _ in scaled.named_parameters() if ".cores." in n}
    assert core_names
    for name, param in scaled.named_parameters():
        plain_step = dict(plain.named_parameters())[name].detach() - start[name]
        expected = scaled_steps * plain_step if name in core_names else plain_step
        torch.testing.assert_close(param.detach() - start[name], expected, rtol=1e-4, atol=1e-7, msg=name)
    assert any(float((p.detach() - start[n]).abs().max()) > 0 for n, p in scaled.named_parameters() if n in core_names)


def test_pruned_cores_are_followed_and_a_scale_of_one_adds_no_hooks():
    model = tensorized()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scaler = CoreStepScale(2.0)
    scaler.attach(layers_of(model), [optimizer])
    layer = tt_layers(model)[0][1]
    with torch.no_grad():
        layer.gates[0][:2] = 0.0
    model(torch.randn(2, 64))  # latches the dead gates
    prune_(model, [optimizer])
    before = [c.detach().clone() for c in cores_of(model)]
    one_step(model, optimizer)
    for core, old in zip(cores_of(model), before):  # Adam's first step: lr · sign(grad) where the gradient is not tiny
        moved = (core.detach() - old).abs()
        torch.testing.assert_close(moved[core.grad.abs() > 1e-4], torch.full_like(moved[core.grad.abs() > 1e-4], 0.2), rtol=1e-3, atol=0)
    scaler.detach()
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks
    CoreStepScale(1.0).attach(layers_of(model), [optimizer])
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks


class TinyLM(nn.Module):
    """A token table, a feature map and an untied head to the vocabulary (what a language model has)."""

    def __init__(self, vocab: int = 256, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mlp = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        return self.lm_head(self.proj(torch.relu(self.mlp(self.embed(ids)))))


def tiny_lm():
    torch.manual_seed(0)
    model = TinyLM()
    tensorize(model)
    return model


def test_tensorize_marks_the_token_table_and_the_vocabulary_head_as_vocabulary_layers():
    model = tiny_lm()
    kinds = {name: is_vocabulary_layer(layer) for name, layer in tt_layers(model)}
    assert kinds == {"embed": True, "mlp": False, "proj": False, "lm_head": True}


@pytest.mark.parametrize("trained_compression, lr, vocabulary_scale",
                         [(None, 3e-3, VOCABULARY_STEP_SCALE), (4.0, 3e-3, TRAINED_VOCABULARY_STEP_SCALE), (4.0, 1e-2, 4.0),
                          (2.0, 2e-3, 6.0), (4.0, 1e-3, VOCABULARY_STEP_SCALE), (8.0, 3e-3, VOCABULARY_STEP_SCALE)])
def test_auto_stretches_only_the_vocabulary_layers_steps(trained_compression, lr, vocabulary_scale):
    """From scratch the token cores move 12x as far; from trained weights to a budget of at most 4x, so far that their
    LR is at most TRAINED_TOKEN_LR_CAP (0.012), from 4x to 12x; beyond 4x, 12x."""
    plain, ruled = tiny_lm(), tiny_lm()
    start = copy.deepcopy(plain.state_dict())
    plain_opt, ruled_opt = torch.optim.AdamW(plain.parameters(), lr=lr), torch.optim.AdamW(ruled.parameters(), lr=lr)
    rule = CoreStepScale("auto", trained_compression=trained_compression)
    rule.attach(layers_of(ruled), [ruled_opt])
    assert rule.stretch_of(ruled.embed) == vocabulary_scale and rule.stretch_of(ruled.mlp) == 1.0
    assert {id(layer) for layer in rule.stretched_layers()} == {id(ruled.embed), id(ruled.lm_head)}
    for model, optimizer in ((plain, plain_opt), (ruled, ruled_opt)):
        torch.manual_seed(1)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(torch.randint(0, 256, (4, 8))).flatten(0, 1), torch.randint(0, 256, (32,))).backward()
        optimizer.step()
    head_out = [f"lm_head.cores.{k}" for k in range(len(ruled.lm_head.in_modes), len(ruled.lm_head.cores))]
    for name, param in ruled.named_parameters():
        plain_step = dict(plain.named_parameters())[name].detach() - start[name]
        factor = vocabulary_scale if name.startswith("embed.cores") or name in head_out else 1.0
        torch.testing.assert_close(param.detach() - start[name], factor * plain_step, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("per_side", [1, 2])
def test_a_vocabulary_heads_token_cores_are_its_output_cores(per_side):
    """The head's input cores are shared by every token (stretched, they blew a width-512 model up): only the cores
    holding the vocabulary's modes are token cores; a token table's cores all are, a feature map's none."""
    head = TTLinear(64, 1000, bias=False, num_cores=per_side, max_rank=8)
    assert head.token_cores() == []
    head.vocabulary_layer = True
    assert head.token_cores() == list(range(per_side, 2 * per_side))
    assert [head.core_modes[k][0] for k in head.token_cores()] == list(head.out_modes)
    model = tiny_lm()
    assert model.embed.token_cores() == list(range(len(model.embed.cores))) and model.mlp.token_cores() == []


def test_auto_adds_no_hooks_to_a_model_without_vocabulary_layers():
    model = tensorized()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    CoreStepScale().attach(layers_of(model), [optimizer])
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks


@pytest.mark.parametrize("init, compression, asked", [("svd", 2.0, 2.0), ("svd", 8.0, 8.0), ("random", 2.0, None)])
def test_the_callback_tells_the_step_rule_how_far_a_trained_model_is_cut(tmp_path, init, compression, asked):
    callback = ComeraCallback(tensorize=TensorizeConfig(init=init, min_compression=1.0),
                              budget=BudgetConfig(compression=compression))
    trainer(tmp_path, [callback], max_steps=2).fit(PlainClassifier(), *loaders())
    assert callback.core_steps.trained_compression == asked


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), "fast"])
def test_a_scale_that_is_not_positive_is_refused(scale):
    with pytest.raises(ValueError, match="core_step_scale"):
        ComeraCallback(core_step_scale=scale)


def test_the_callback_scales_the_core_steps_of_the_module_optimizer(tmp_path):
    """Same data, same seed: the cores' first step under the callback is ``core_step_scale`` times the plain one."""
    steps = {}
    for scale in (1.0, 4.0):
        torch.manual_seed(0)
        model = PlainClassifier()
        comera = ComeraCallback(max_rank=8, early_epochs=1, core_step_scale=scale)
        trainer = L.Trainer(max_steps=1, callbacks=[comera], logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
        first = {}

        class Remember(L.Callback):
            def on_train_start(self, trainer, pl_module):
                first.update({n: p.detach().clone() for n, p in pl_module.named_parameters() if ".cores." in n})

        trainer.callbacks.append(Remember())
        trainer.fit(model, *loaders())
        steps[scale] = {n: p.detach() - first[n] for n, p in model.named_parameters() if n in first}
    assert steps[1.0]
    for name, step in steps[1.0].items():
        torch.testing.assert_close(steps[4.0][name], 4.0 * step, rtol=1e-3, atol=1e-7)


def test_the_trained_rule_reads_the_lr_a_schedule_starts_from_not_its_warm_up():
    model = tiny_lm()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / 100)  # LR 0 at the first step: warm-up
    rule = CoreStepScale("auto", trained_compression=2.0)
    rule.attach(layers_of(model), [optimizer])
    assert optimizer.param_groups[0]["lr"] == 0.0 and rule.stretch_of(model.embed) == TRAINED_VOCABULARY_STEP_SCALE
