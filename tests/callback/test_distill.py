"""Distillation while a trained model is compressed: the dense model as it was is the teacher (issue #52)."""

import lightning as L
import pytest
import torch
from torch import nn

from comera_lightning import BudgetConfig, ComeraCallback, DistillConfig, TensorizeConfig
from comera_lightning.callback.distill import soft_target_loss
from tests.callback.test_compress_trained import trained_classifier
from tests.helpers.callback_runs import trainer
from tests.helpers.plain_modules import PlainClassifier, loaders


def test_the_soft_target_term_is_zero_only_where_student_and_teacher_agree():
    teacher = torch.randn(4, 3, 10)
    assert float(soft_target_loss(teacher, teacher, 2.0)) == pytest.approx(0.0, abs=1e-6)
    student = torch.randn(4, 3, 10, requires_grad=True)
    term = soft_target_loss(student, teacher, 2.0)
    term.backward()
    assert float(term) > 0 and student.grad.abs().sum() > 0


def test_a_binary_models_single_logit_is_distilled_as_a_bernoulli_not_across_the_batch():
    # A DLRM returns one click logit per example, (B,): softmax over that axis would mix the batch's examples.
    student, teacher, t = torch.randn(64), torch.randn(64), 2.0
    p, q = torch.sigmoid(teacher / t), torch.sigmoid(student / t)
    bernoulli = (p * (p.log() - q.log()) + (1 - p) * ((1 - p).log() - (1 - q).log())).mean() * t ** 2
    torch.testing.assert_close(soft_target_loss(student, teacher, t), bernoulli)
    torch.testing.assert_close(soft_target_loss(student[:, None], teacher[:, None], t), bernoulli)
    assert float(soft_target_loss(teacher, teacher, t)) == pytest.approx(0.0, abs=1e-6)


class Recorder(L.Callback):
    """The objective the callback handed back, beside the task loss, each step."""

    def __init__(self):
        self.pairs = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        cb = next(c for c in trainer.callbacks if isinstance(c, ComeraCallback))
        self.pairs.append((float(outputs["loss"]), float(cb.stage_objective.last["task_loss"])))


def test_a_compress_run_distils_the_trained_model_into_its_tensorized_self(tmp_path, caplog):
    caplog.set_level("INFO")
    model = trained_classifier(tmp_path)
    dense_logits = model(loaders()[1].dataset.tensors[0]).detach()
    cb = ComeraCallback(tensorize=TensorizeConfig(init="svd"), budget=BudgetConfig(compression=8.0),
                        distill=DistillConfig(module="", weight=0.5, temperature=2.0))
    record = Recorder()
    trainer(tmp_path, [cb, record], max_epochs=2).fit(model, *loaders())
    teacher = cb.teacher.model
    torch.testing.assert_close(teacher(loaders()[1].dataset.tensors[0]), dense_logits)  # frozen: the model as it was
    assert not any(p.requires_grad for p in teacher.parameters())
    assert all(id(p) not in {id(q) for q in teacher.parameters()} for p in model.parameters())
    assert all(abs(loss - task) > 1e-6 for loss, task in record.pairs), "every step's objective holds the teacher's term"
    assert cb.teacher._handle is None, "the hook goes with the fit"
    assert "teacher: a frozen copy of the LightningModule's forward as trained, weight 0.5 at temperature 2" in caplog.text


def test_a_submodule_that_does_not_exist_is_named_and_a_resume_is_refused(tmp_path):
    model = trained_classifier(tmp_path)
    cb = ComeraCallback(tensorize=TensorizeConfig(init="svd"), distill=DistillConfig(module="decoder"))
    with pytest.raises(ValueError, match=r"no submodule 'decoder'; its children are \['encoder', 'head'\]"):
        trainer(tmp_path, [cb], max_epochs=1).fit(model, *loaders())
    with pytest.raises(ValueError, match="weight"):
        DistillConfig(weight=1.5)
    saved = tmp_path / "compressed.ckpt"
    run = trainer(tmp_path, [ComeraCallback(tensorize=TensorizeConfig(init="svd"))], max_epochs=1)
    run.fit(model, *loaders())
    run.save_checkpoint(saved)
    cb = ComeraCallback(tensorize=TensorizeConfig(init="svd"), distill=DistillConfig(module=""))
    with pytest.raises(ValueError, match="a resumed run no longer has"):
        trainer(tmp_path, [cb], max_epochs=2).fit(trained_classifier(tmp_path), *loaders(), ckpt_path=str(saved))


class LayersCalledDirectly(PlainClassifier):
    """A training_step that calls its layers, not its forward (as the package's masked LM does)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.head(self.encoder(x)), y)


def test_a_teacher_whose_module_the_training_step_never_calls_is_refused_not_silently_idle(tmp_path):
    model = LayersCalledDirectly()
    cb = ComeraCallback(tensorize=TensorizeConfig(init="svd"), distill=DistillConfig(module=""))
    with pytest.raises(ValueError, match=r"the LightningModule's forward was not called in this training step.*"
                                         r"DistillConfig\(module=\.\.\.\)"):
        trainer(tmp_path, [cb], max_epochs=1).fit(model, *loaders())
    model = LayersCalledDirectly()
    cb = ComeraCallback(tensorize=TensorizeConfig(init="svd"), distill=DistillConfig(module="head"))
    trainer(tmp_path, [cb], max_epochs=1).fit(model, *loaders())  # the head is called: its dense copy teaches


def test_a_test_run_after_the_fit_keeps_the_dense_teacher(tmp_path):
    model = trained_classifier(tmp_path)
    cb = ComeraCallback(tensorize=TensorizeConfig(init="svd"), distill=DistillConfig(module=""))
    run = trainer(tmp_path, [cb], max_epochs=1)
    run.fit(model, *loaders())
    teacher = cb.teacher.model
    run.test(model, loaders()[1], verbose=False)
    assert cb.teacher.model is teacher and not any("cores" in name for name, _ in teacher.named_parameters())
