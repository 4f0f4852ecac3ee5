"""GateOptimizer on its own (plain torch) and under the callback with the module's own optimizer."""

import lightning as L
import pytest
import torch

from comera_lightning import ComeraCallback, tensorize
from comera_lightning.optim.gates import GateOptimizer
from comera_lightning.rank import prune_, tt_layers
from tests.helpers.plain_modules import PlainClassifier, loaders


def tensorized():
    torch.manual_seed(0)
    model = PlainClassifier()
    tensorize(model, max_rank=8, num_cores=3)
    gates = [g for _, layer in tt_layers(model) for g in layer.gates]
    return model, gates


def test_attach_takes_the_gates_out_of_the_module_optimizer_and_keeps_its_groups():
    model, gates = tensorized()
    user = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(user, T_max=10)
    gate_opt = GateOptimizer(lr=0.05)
    gate_opt.attach(gates, [user])
    held = {id(p) for group in user.param_groups for p in group["params"]}
    assert not held & {id(g) for g in gates} and len(user.param_groups) == 1
    assert gate_opt.parameters() == gates and gate_opt.optimizer.param_groups[0]["weight_decay"] == 0.0
    before = [g.detach().clone() for g in gates]
    model(torch.randn(4, 64)).sum().backward()
    user.step()  # the gates step right after, at their own lr, and their gradients are cleared
    schedule.step()
    assert all(g.grad is None for g in gates)
    moved = max(float((g.detach() - b).abs().max()) for g, b in zip(gates, before))
    assert moved == pytest.approx(0.05, rel=1e-3), "Adam's first step moves each gate by about lr"


def test_gates_follow_skipped_and_accumulated_steps_of_the_host():
    model, gates = tensorized()
    user = torch.optim.SGD(model.parameters(), lr=0.1)
    gate_opt = GateOptimizer(lr=0.01)
    gate_opt.attach(gates, [user])
    before = [g.detach().clone() for g in gates]
    for _ in range(2):  # accumulate two micro-batches, no step yet
        model(torch.randn(4, 64)).sum().backward()
    assert all(torch.equal(g, b) for g, b in zip(gates, before)), "no host step, no gate step"
    user.step()
    assert gate_opt.optimizer.state[gates[0]]["step"] == 1
    gate_opt.detach()
    model(torch.randn(4, 64)).sum().backward()
    user.step()
    assert gate_opt.state_dict()["state"][0]["step"] == 1, "detached: no longer follows the host"


def test_gates_frozen_from_the_start_stay_put_and_their_importance_is_tracked():
    """Gates frozen before their first step: no gate moves, yet each has its smoothed |g · ∂L/∂g|, which a budget's
    cuts rank by (without it they chose blindly: a trained Llama held so went 3.2 -> 5.2)."""
    model, gates = tensorized()
    user = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gate_opt = GateOptimizer(lr=0.05)
    gate_opt.attach(gates, [user])
    gate_opt.freeze(True)
    for _ in range(2):
        model(torch.randn(4, 64)).pow(2).sum().backward()
        user.step()
    assert all(bool((g == 1).all()) for g in gates)
    importance = [gate_opt.importance_of(g) for g in gates]
    assert all(i is not None and bool((i > 0).any()) for i in importance)
    assert gate_opt.optimizer.param_groups[0]["lr"] == 0.05


def test_prune_slices_the_gate_optimizer_state_and_a_restored_state_loads_at_attach():
    model, gates = tensorized()
    user = torch.optim.AdamW(model.parameters())
    gate_opt = GateOptimizer()
    gate_opt.attach(gates, [user])
    model(torch.randn(4, 64)).sum().backward()
    user.step()
    layer = tt_layers(model)[0][1]
    with torch.no_grad():
        layer.gates[1][:3] = 0.0
    prune_(model, [user, *gate_opt.optimizers()])
    new_gate = layer.gates[1]
    assert gate_opt.optimizer.state[new_gate]["exp_avg"].shape == new_gate.shape
    saved = gate_opt.state_dict()
    fresh = GateOptimizer()
    fresh.load_state_dict(saved)  # before attach: kept until the optimizer exists
    fresh.attach([g for _, m in tt_layers(model) for g in m.gates], [torch.optim.AdamW(model.parameters())])
    torch.testing.assert_close(fresh.optimizer.state_dict()["state"], saved["state"])


def test_gradient_scale_is_undone_before_the_gate_step():
    model, gates = tensorized()
    user = torch.optim.SGD(model.parameters(), lr=0.0)
    plain, scaled = GateOptimizer(lr=0.1), GateOptimizer(lr=0.1)
    plain.attach(gates, [user])
    (model(torch.randn(4, 64)).sum()).backward()
    grads = [g.grad.clone() for g in gates]
    plain.detach()
    scaled.attach(gates, [torch.optim.SGD(model.parameters(), lr=0.0)])
    scaled.follow_scaler(torch.amp.GradScaler("cpu", init_scale=8.0))
    for g, grad in zip(gates, grads):
        g.grad = grad * 8.0
    scaled.step()
    for g, grad in zip(gates, grads):
        assert g.grad is None
    torch.testing.assert_close(scaled.optimizer.state[gates[0]]["exp_avg"], 0.1 * grads[0])


def test_bad_gate_lr_is_refused():
    with pytest.raises(ValueError, match="gate_lr"):
        ComeraCallback(gate_lr=0.0)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "adagrad"])
def test_module_optimizer_never_sees_the_gates_and_the_checkpoint_has_their_state(tmp_path, optimizer):
    L.seed_everything(0)
    model = PlainClassifier(optimizer=optimizer, cosine=True)
    cb = ComeraCallback(max_rank=8, early_epochs=1, target_ratio=0.3, gate_lr=3e-2)
    trainer = L.Trainer(max_epochs=3, callbacks=[cb], logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, accelerator="cpu")
    trainer.fit(model, *loaders())
    gate_ids = {id(g) for _, layer in tt_layers(model) for g in layer.gates}
    held = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert not gate_ids & held
    assert cb.prune_events >= 1 and sum(sum(layer.physical_ranks) for _, layer in tt_layers(model)) < 72
    saved = torch.load(next(tmp_path.rglob("*.ckpt")), weights_only=False)
    state = next(v for k, v in saved["callbacks"].items() if "ComeraCallback" in k)["gates"]["state"]
    assert len(state) == len(gate_ids) and all(s["exp_avg"].numel() for s in state.values())


def test_the_current_gate_settings_win_over_a_loaded_state_and_another_models_state_is_dropped():
    model, gates = tensorized()
    first = GateOptimizer(lr=0.02)
    first.attach(gates, [torch.optim.AdamW(model.parameters())])
    model(torch.randn(4, 64)).sum().backward()
    first.step()
    resumed = GateOptimizer(lr=0.1)
    resumed.load_state_dict(first.state_dict())
    resumed.attach(gates, [torch.optim.AdamW(model.parameters())])
    assert resumed.optimizer.param_groups[0]["lr"] == 0.1, "gate_lr given now is used"
    assert resumed.optimizer.state[gates[0]]["step"] == 1, "the moments are restored"
    other_model, other_gates = tensorized()
    layer = tt_layers(other_model)[0][1]
    with torch.no_grad():
        layer.gates[0][:2] = 0.0
    prune_(other_model)
    stale = GateOptimizer()
    stale.load_state_dict(first.state_dict())
    stale.attach([g for _, m in tt_layers(other_model) for g in m.gates], [torch.optim.AdamW(other_model.parameters())])
    assert not stale.optimizer.state, "a state saved for other gate shapes is not loaded"


def test_a_step_with_non_finite_gate_gradients_is_skipped_under_a_scaler():
    model, gates = tensorized()
    gate_opt = GateOptimizer(lr=0.1)
    gate_opt.attach(gates, [torch.optim.SGD(model.parameters(), lr=0.0)])
    gate_opt.follow_scaler(torch.amp.GradScaler("cpu", init_scale=1024.0))
    before = [g.detach().clone() for g in gates]
    for g in gates:
        g.grad = torch.full_like(g, float("inf"))
    gate_opt.step()
    assert all(torch.equal(g, b) for g, b in zip(gates, before)) and all(g.grad is None for g in gates)




def test_gate_lr_follows_the_host_schedule_when_asked():
    model, gates = tensorized()
    host = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.optim.lr_scheduler.LambdaLR(host, lambda step: 0.5)  # sets initial_lr, lr = 0.5 × initial_lr
    following, constant = GateOptimizer(lr=0.02, follow_schedule=True), GateOptimizer(lr=0.02)
    following.attach(gates, [host])
    model(torch.randn(4, 64)).sum().backward()
    host.step()
    assert following.optimizer.param_groups[0]["lr"] == pytest.approx(0.01)
    following.detach()
    constant.attach(gates, [host])
    host.step()
    assert constant.optimizer.param_groups[0]["lr"] == pytest.approx(0.02)
