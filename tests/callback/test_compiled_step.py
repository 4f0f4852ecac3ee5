"""The callback's step machinery under torch.compile: the objective as one graph, the optimizer hooks, a whole fit.

The objective (gates, masks, the size surrogate, the finite-loss guard, L₀'s running mean, the guarded late stage)
compiles with ``fullgraph=True`` in every stage. ``optimizer.step()`` cannot be one graph (torch breaks the graph
around every step, ``torch/optim/optimizer.py``'s ``_use_grad``): the core step and gate hooks add no break of their
own. A whole ``Trainer.fit`` of a compiled module (``fullgraph=True``) prunes like the eager one.
"""

import copy
import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from comera_lightning import ComeraCallback, tensorize
from comera_lightning.rank import tt_layers
from tests.helpers.lm_modules import ForwardLM, tiny_llama

transformers = pytest.importorskip("transformers")


def _setup(late_objective: str = "guarded"):
    """A default-tensorized tiny Llama, AdamW, and a callback's objective and optimizer hooks attached to them."""
    model = tiny_llama()
    tensorize(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    comera = ComeraCallback(late_objective=late_objective)
    layers = [layer for _, layer in tt_layers(model)]
    comera.stage_objective.bind(layers)
    comera.gate_optimizer.attach([g for layer in layers for g in layer.gates], [optimizer])
    comera.core_steps.attach(layers, [optimizer])
    return model, optimizer, comera


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 384, (2, 12), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("stage, late_objective", [("early", "guarded"), ("late", "guarded"), ("late", "paper"), ("final", "guarded")])
def test_the_objective_compiles_as_one_graph_in_every_stage(stage, late_objective):
    model, _, comera = _setup(late_objective)
    if stage != "early":
        comera.stage_objective.enter_late(6.0)
        comera.schedule.stage = stage
    twin, twin_comera = copy.deepcopy((model, comera))
    compiled = torch.compile(twin_comera.objective, fullgraph=True, backend="aot_eager")
    for seed in (0, 1):  # the second call reuses the kept logging tensors and the running means
        ids = _ids(seed)
        got, expected = compiled(twin(input_ids=ids, labels=ids).loss), comera.objective(model(input_ids=ids, labels=ids).loss)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    got.backward()
    expected.backward()
    gate, twin_gate = model.lm_head.gates[0], twin.lm_head.gates[0]
    torch.testing.assert_close(twin_gate.grad, gate.grad, rtol=1e-4, atol=1e-7)
    for name in ("task_loss", "size_surrogate", *(("lam", "active_size") if stage == "late" else ())):
        torch.testing.assert_close(twin_comera.stage_objective.last[name], comera.stage_objective.last[name], msg=name)


def test_the_core_step_and_gate_hooks_add_no_graph_break_and_step_like_eager():
    model, optimizer, _ = _setup()
    twin, twin_optimizer, _ = _setup()

    def step(net, opt, seed=0):
        net(input_ids=_ids(seed), labels=_ids(seed)).loss.backward()
        opt.step()
        opt.zero_grad()

    step(model, optimizer)
    step(twin, twin_optimizer)  # eager first: every optimizer state (Adam's, the gates' importance) is set up
    step(model, optimizer, 1)
    twin(input_ids=_ids(1), labels=_ids(1)).loss.backward()
    explained = torch._dynamo.explain(lambda: twin_optimizer.step())()
    twin_optimizer.zero_grad()
    breaks = [(frame.filename, frame.name) for reason in explained.break_reasons for frame in reason.user_stack[-1:]]
    assert breaks and all(file.endswith("torch/optim/optimizer.py") and name == "_use_grad" for file, name in breaks), breaks
    compiled_step = torch.compile(lambda: twin_optimizer.step(), backend="aot_eager")
    for seed in (2, 3):
        step(model, optimizer, seed)
        twin(input_ids=_ids(seed), labels=_ids(seed)).loss.backward()
        compiled_step()
        twin_optimizer.zero_grad()
    for (name, p), (_, q) in zip(model.named_parameters(), twin.named_parameters()):
        torch.testing.assert_close(q, p, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}: {m}")  # Adam's noise; cores step ~6e-2


def _fit(compiled: bool):
    """A short fit of a default-tensorized tiny Llama with step-based stages and prunes; (module, callback, losses)."""
    L.seed_everything(0)
    module = ForwardLM(lr=3e-3)
    ids = torch.randint(0, 384, (96, 12), generator=torch.Generator().manual_seed(0))
    train, val = DataLoader(TensorDataset(ids), batch_size=8), DataLoader(TensorDataset(ids[:16]), batch_size=8)
    comera = ComeraCallback(early_steps=12, prune_every_n_steps=6, late_objective="paper", target_ratio=0.6, gate_lr=0.05)
    losses = LossesSeen()
    trainer = L.Trainer(max_steps=36, val_check_interval=12, callbacks=[comera, losses], logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, accelerator="cpu")
    trainer.fit(torch.compile(module, fullgraph=True, backend="aot_eager") if compiled else module, train, val)
    return module, comera, losses.values


class LossesSeen(L.Callback):
    def __init__(self):
        self.values = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.values.append(float(outputs["loss"]))


def test_a_fit_of_a_compiled_module_prunes_like_the_eager_one():
    torch._dynamo.reset()
    module, comera, losses = _fit(compiled=True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1, "the forward was compiled"
    eager, eager_comera, eager_losses = _fit(compiled=False)
    assert comera.prune_events >= 2 and comera.prune_events == eager_comera.prune_events
    fresh = tiny_llama()
    tensorize(fresh)
    before = [layer.physical_ranks for _, layer in tt_layers(fresh)]
    after = [layer.physical_ranks for _, layer in tt_layers(module)]
    assert after == [layer.physical_ranks for _, layer in tt_layers(eager)]
    assert sum(map(sum, after)) < sum(map(sum, before)), f"no rank was pruned: {after}"
    assert all(map(math.isfinite, losses)) and len(losses) == len(eager_losses) == 36
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), rtol=1e-3, atol=1e-4)
