"""SentencePairClassifier: shapes, plain layers with BERT init, the paper's size, optimizers, training."""

from __future__ import annotations

import functools

import lightning
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from comera_lightning.models import EncoderConfig, SentencePairClassifier, TransformerEncoderModel

TINY = dict(vocab_size=50, d_model=32, num_layers=2, num_heads=4, d_ff=64, max_positions=16)


def tiny_config(**overrides) -> EncoderConfig:
    return EncoderConfig(**{**TINY, "dropout": 0.0, **overrides})


def tiny_classifier(**overrides) -> SentencePairClassifier:
    return SentencePairClassifier(**{**TINY, "dropout": 0.0, **overrides})


def test_shapes():
    torch.manual_seed(0)
    model = TransformerEncoderModel(tiny_config()).eval()
    ids = torch.randint(1, 50, (3, 10))
    assert model(ids).shape == (3, 10, 32)
    assert model(ids, torch.ones(3, 10, dtype=torch.long), torch.zeros_like(ids)).shape == (3, 10, 32)

    clf = tiny_classifier(num_classes=5).eval()
    logits = clf(ids, torch.ones_like(ids), torch.zeros_like(ids))
    assert logits.shape == (3, 5)
    preds = clf.predict_step({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 0)
    assert preds.shape == (3,) and preds.dtype == torch.long


def test_only_plain_linear_and_embedding_with_bert_init():
    torch.manual_seed(0)
    model = tiny_classifier(num_layers=3)
    assert not any(isinstance(m, nn.MultiheadAttention) for m in model.modules())
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    for i in range(3):
        for name in ("attention.query", "attention.key", "attention.value", "attention.output"):
            assert f"backbone.encoder.layers.{i}.{name}" in linears
        assert model.get_submodule(f"backbone.encoder.layers.{i}.ffn.intermediate").weight.shape == (64, 32)
        assert model.get_submodule(f"backbone.encoder.layers.{i}.ffn.output").weight.shape == (32, 64)
    assert len(linears) == 3 * 6 + 2  # + pooler and classifier
    embeddings = {n for n, m in model.named_modules() if isinstance(m, nn.Embedding)}
    assert embeddings == {
        f"backbone.embeddings.{n}" for n in ("word_embeddings", "position_embeddings", "token_type_embeddings")
    }

    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            assert torch.all(m.bias == 0), name
            assert 0.01 < m.weight.std().item() < 0.03, name
        elif isinstance(m, nn.LayerNorm):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0), name
    word = model.backbone.embeddings.word_embeddings
    assert torch.all(word.weight[0] == 0) and word.padding_idx == 0
    assert 0.015 < word.weight[1:].std().item() < 0.025


def test_paper_size_parameter_count():
    model = SentencePairClassifier()  # 30,522 vocab, 768 wide, 6 layers, 512 positions, 3 classes
    d, ff, vocab = 768, 3072, 30522
    embeddings = (vocab + 512 + 2) * d + 2 * d
    layer = 4 * (d * d + d) + (d * ff + ff) + (ff * d + d) + 2 * 2 * d
    head = (d * d + d) + (d * 3 + 3)
    expected = embeddings + 6 * layer + head
    total = sum(p.numel() for p in model.parameters())
    assert total == expected == 66_957_315
    assert abs(total - 67e6) / 67e6 < 0.01  # docs/METHOD.md §1.3: "dense ≈ 67 M parameters ≈ 256 MB fp32"
    enc = model.get_submodule("backbone.encoder.layers.0.attention.query")
    assert enc.weight.shape == (768, 768)


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


def test_configure_optimizers_default_and_injected():
    model = tiny_classifier()
    model.backbone.encoder.layers[0].attention.query = FakeTT(32)  # swapped after __init__, like tensorize
    opt = model.configure_optimizers()
    assert type(opt) is torch.optim.AdamW
    assert [(g["name"], g["lr"], g["weight_decay"]) for g in opt.param_groups] == [
        ("cores", 1e-4, 0.0),
        ("other", 5e-5, 0.0),
    ], "the rank gates are ComeraCallback's (its gate_lr), not the module's"

    model = tiny_classifier(
        lr_other=0.3,
        optimizer=functools.partial(torch.optim.SGD, lr=0.5, momentum=0.9),
        scheduler=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1),
    )
    model.backbone.encoder.layers[0].attention.query = FakeTT(32)
    config = model.configure_optimizers()
    opt = config["optimizer"]
    assert type(opt) is torch.optim.SGD
    assert [(g["name"], g["lr"], g["momentum"]) for g in opt.param_groups] == [
        ("cores", 1e-4, 0.9),
        ("other", 0.3, 0.9),
    ]
    assert isinstance(config["lr_scheduler"]["scheduler"], torch.optim.lr_scheduler.StepLR)
    assert config["lr_scheduler"]["interval"] == "step"


def test_lightning_cli_optimizer_injection():
    from lightning.pytorch.cli import LightningCLI

    args = [f"--model.{k}={v}" for k, v in TINY.items()]
    args += ["--model.optimizer=torch.optim.SGD", "--model.optimizer.lr=0.7", "--trainer.logger=false"]
    cli = LightningCLI(SentencePairClassifier, run=False, args=args, save_config_callback=None)
    opt = cli.model.configure_optimizers()
    assert type(opt) is torch.optim.SGD
    assert [g["lr"] for g in opt.param_groups] == [5e-5]  # the group lr wins over the optimizer default


class TinyPairs(Dataset):
    """Random sentence pairs whose label is a function of the token right after [CLS]."""

    def __init__(self, n: int = 64, seq: int = 12, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(1, 50, (n, seq), generator=g)
        self.input_ids[:, 0] = 1  # [CLS]
        lengths = torch.randint(6, seq + 1, (n,), generator=g)
        self.attention_mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        self.input_ids = self.input_ids * self.attention_mask  # pad id 0
        self.token_type_ids = (torch.arange(seq)[None, :] >= lengths[:, None] // 2).long() * self.attention_mask
        self.labels = self.input_ids[:, 1] % 3

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.input_ids[i],
            "token_type_ids": self.token_type_ids[i],
            "attention_mask": self.attention_mask[i],
            "labels": self.labels[i],
        }


class LossRecorder(lightning.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def test_trains_and_loss_decreases(tmp_path):
    lightning.seed_everything(0, verbose=False)
    model = tiny_classifier(lr_other=3e-3)
    loader = DataLoader(TinyPairs(), batch_size=16, shuffle=True)
    eval_loader = DataLoader(TinyPairs(), batch_size=16)
    recorder = LossRecorder()
    trainer = lightning.Trainer(
        max_steps=80,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[recorder],
    )
    trainer.fit(model, loader, eval_loader)
    losses = recorder.losses
    assert len(losses) == 80
    assert sum(losses[-8:]) / 8 < 0.7 * sum(losses[:8]) / 8, losses
    assert {"train/loss", "train/acc", "val/loss", "val/acc"} <= set(trainer.callback_metrics)

    (test_metrics,) = trainer.test(model, eval_loader, verbose=False)
    assert set(test_metrics) == {"test/loss", "test/acc"}
    assert test_metrics["test/acc"] > 0.5  # chance is 1/3

    preds = torch.cat(trainer.predict(model, eval_loader))
    assert preds.shape == (64,) and preds.dtype == torch.long
    assert (preds == TinyPairs().labels).float().mean() > 0.5

    ckpt = tmp_path / "model.ckpt"
    trainer.save_checkpoint(ckpt)
    loaded = SentencePairClassifier.load_from_checkpoint(ckpt)
    assert loaded.hparams.d_model == 32
    batch = next(iter(DataLoader(TinyPairs(), batch_size=4)))
    torch.testing.assert_close(loaded.eval()(batch["input_ids"]), model.eval()(batch["input_ids"]))
