"""The capture machinery of CUDAGraphStrategy (comera_lightning.strategy.capture), without CUDA or Lightning runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from comera_lightning import CAME
from comera_lightning.strategy import GraphedOptimizer
from comera_lightning.strategy.capture import (
    CAPTURE,
    EAGER,
    REPLAY,
    WARMUP,
    DeferredCall,
    GraphCache,
    StepGraph,
    UncapturableBatch,
    batch_key,
    deferring,
    make_capturable_,
    pad_to_bucket,
)
from tests.helpers.plain_modules import PlainClassifier


def test_graph_cache_warms_up_captures_replays_and_forgets_on_invalidate():
    cache = GraphCache(warmup_steps=2, max_graphs=2)
    plans = []
    for _ in range(4):
        plan = cache.plan("a")
        plans.append(plan)
        if plan == WARMUP:
            cache.warmed("a")
        elif plan == CAPTURE:
            cache.store("a", "graph a")
    assert plans == [WARMUP, WARMUP, CAPTURE, REPLAY]
    cache.warmed("b"), cache.warmed("b")
    cache.store("b", "graph b")
    cache.warmed("c"), cache.warmed("c")
    assert cache.plan("c") == EAGER, "no room for a third shape"
    assert cache.captures == 2
    cache.invalidate()  # a prune: shapes changed
    assert cache.plan("a") == WARMUP and not cache.graphs and cache.invalidations == 1
    cache.clear()
    assert cache.invalidations == 1, "clearing at the end of training is not an invalidation"


def test_batch_key_follows_structure_shape_and_dtype_and_refuses_non_tensors():
    x, y = torch.zeros(4, 8), torch.zeros(4, dtype=torch.long)
    assert batch_key((x, y)) == batch_key((x + 1, y + 1))
    assert batch_key((x, y)) != batch_key((torch.zeros(3, 8), y))
    assert batch_key((x, y)) != batch_key((x.double(), y))
    assert batch_key({"a": x, "b": y}) != batch_key((x, y))
    assert batch_key({"a": x, "mask": None}) == batch_key({"a": x, "mask": None})
    with pytest.raises(UncapturableBatch, match=r"batch\['ids'\] is a str"):
        batch_key({"ids": "abc"})
    with pytest.raises(UncapturableBatch, match="the batch is a SimpleNamespace.*KeyedJaggedTensor"):
        batch_key(SimpleNamespace(dense=x))


def test_padding_to_buckets():
    batch = {"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 5), "labels": torch.ones(2)}
    pads = {"input_ids": 7, "attention_mask": 0}
    padded = pad_to_bucket(batch, [4, 8, 16], pads)
    assert padded["input_ids"].shape == (2, 8) and padded["input_ids"][:, 5:].eq(7).all()
    assert padded["attention_mask"][:, 5:].eq(0).all() and padded["attention_mask"][:, :5].eq(1).all()
    assert padded["labels"] is batch["labels"], "keys not in pad_values stay as they are"
    assert pad_to_bucket(batch, [5, 8], pads) is batch, "a batch at a bucket's length is not copied"
    three_d = pad_to_bucket({"h": torch.ones(2, 3, 4)}, [6], {"h": -1.0})["h"]
    assert three_d.shape == (2, 6, 4) and three_d[:, 3:].eq(-1).all()
    with pytest.raises(UncapturableBatch, match="sequence length 5 is longer than the largest bucket \\(4\\)"):
        pad_to_bucket(batch, [4], pads)
    with pytest.raises(UncapturableBatch, match="disagree"):
        pad_to_bucket({"input_ids": torch.ones(2, 5), "attention_mask": torch.ones(2, 6)}, [8], pads)
    with pytest.raises(UncapturableBatch, match="dict batches"):
        pad_to_bucket((torch.ones(2, 5),), [8], pads)


def test_step_graph_static_batch_and_reissued_outputs_without_cuda():
    batch = {"x": torch.arange(6.0).view(2, 3), "y": torch.tensor([0, 1])}
    entry = StepGraph(batch)
    assert entry.static_batch["x"] is not batch["x"] and torch.equal(entry.static_batch["x"], batch["x"])
    entry.load({"x": torch.ones(2, 3), "y": torch.tensor([1, 1])})
    assert entry.static_batch["x"].eq(1).all() and entry.static_batch["y"].eq(1).all()
    seen = []
    entry.outputs = {"loss": torch.tensor(2.0), "n": 3}
    entry.deferred = [DeferredCall(seen.append, ("logged",), {}, None)]
    out = entry.reissue()
    assert seen == ["logged"] and out["n"] == 3
    assert out["loss"] is not entry.outputs["loss"] and out["loss"].item() == 2.0, "a copy: the next replay overwrites"


def test_deferring_records_log_and_metric_calls_then_restores_them():
    module = PlainClassifier()
    module.acc = MulticlassAccuracy(4, average="micro")
    preds, target = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1])
    with deferring(module) as calls:
        module.log("train_loss", torch.tensor(1.0), on_step=True)
        module.acc(preds, target)
        module.acc.update(preds, target)
    assert [call.fn.__name__ for call in calls] == ["log", "forward", "update"]
    assert calls[0].args[0] == "train_loss" and calls[0].kwargs == {"on_step": True}
    assert module.acc.update_count == 0, "nothing ran while recording"
    assert "log" not in module.__dict__ and "forward" not in module.acc.__dict__, "originals are back"
    for call in calls[1:]:
        call.run()
    assert module.acc.update_count == 2 and module.acc.compute() == pytest.approx(2 / 3)


def test_make_capturable_puts_steps_and_learning_rates_on_tensors_that_schedulers_update():
    params = [nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(3))]
    optimizer = CAME([{"params": params[:1]}, {"params": params[1:], "lr": 1e-2}], lr=1e-3)
    sum(p.sum() for p in params).backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** step)
    lrs = make_capturable_(optimizer)
    assert all(g["capturable"] for g in optimizer.param_groups) and optimizer.defaults["capturable"]
    assert [float(lr) for lr in lrs.values()] == pytest.approx([1e-3, 1e-2])
    assert optimizer.param_groups[0]["lr"] is lrs[0]
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] is lrs[0] and float(lrs[0]) == pytest.approx(5e-4), "updated in place"
    assert all(isinstance(s["step"], torch.Tensor) for s in optimizer.state.values())
    with pytest.raises(ValueError, match="SGD has no 'capturable' option"):
        make_capturable_(torch.optim.SGD(params, lr=0.1))


def test_graph_cache_follows_a_signature_and_drops_graphs_only_when_it_changes():
    cache = GraphCache(warmup_steps=1)
    assert cache.follow({"parameters": (1, 2), "stage": "early"}) == []
    cache.warmed("a"), cache.store("a", "graph a")
    cache.pool = "pool"
    assert cache.follow({"parameters": (1, 2), "stage": "early"}) == [], "an empty prune changes nothing"
    assert cache.graphs and cache.invalidations == 0
    assert cache.follow({"parameters": (1, 2), "stage": "late"}) == ["stage"]
    assert not cache.graphs and cache.pool is None and cache.invalidations == 1
    assert cache.follow({"parameters": (1,), "stage": "late"}) == ["parameters"] and cache.invalidations == 1, (
        "nothing left to drop: not counted")
    with pytest.raises(ValueError, match="max_graphs must be an integer >= 1, got 0"):
        GraphCache(max_graphs=0)


def test_graphed_optimizer_keeps_lrs_in_tensors_lists_what_is_frozen_and_gives_the_settings_back():
    params = [nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(2))]
    optimizer = CAME([params[0]], lr=1e-3)
    graphed = GraphedOptimizer(optimizer)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.param_groups[0]["lr"] = 5e-4  # Lightning's manual warm-up writes a float
    optimizer.add_param_group({"params": [params[1]], "lr": 2e-3})
    graphed.sync()
    assert optimizer.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(5e-4), "copied into the same tensor"
    assert isinstance(optimizer.param_groups[1]["lr"], torch.Tensor) and optimizer.param_groups[1]["capturable"]
    frozen = graphed.frozen()
    optimizer.param_groups[0]["betas"] = (0.5, 0.9)
    changed = {k for k in frozen if frozen[k] != graphed.frozen()[k]}
    assert changed == {"group0.betas"}
    state = graphed.plain_state(optimizer.state_dict())
    assert [g["lr"] for g in state["param_groups"]] == pytest.approx([5e-4, 2e-3])
    assert all(g["capturable"] is False for g in state["param_groups"])
    assert optimizer.param_groups[0]["lr"] is lr, "the live optimizer is untouched"
    graphed.restore()
    assert [type(g["lr"]) for g in optimizer.param_groups] == [float, float]
    assert not optimizer.defaults["capturable"] and not any(g["capturable"] for g in optimizer.param_groups)
