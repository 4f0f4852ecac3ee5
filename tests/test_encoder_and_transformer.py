"""Tests for the BERT-style encoder, the MNLI LightningModule and the three optimizer param groups."""

from __future__ import annotations

import functools
import math

import lightning
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from comera_lightning.models import (
    EncoderConfig,
    EncoderLayer,
    SentencePairClassifier,
    TransformerEncoderModel,
)
from comera_lightning.optim.param_groups import comera_param_groups, param_group_of

TINY = dict(vocab_size=50, d_model=32, num_layers=2, num_heads=4, d_ff=64, max_positions=16)


def tiny_config(**overrides) -> EncoderConfig:
    return EncoderConfig(**{**TINY, "dropout": 0.0, **overrides})


def tiny_classifier(**overrides) -> SentencePairClassifier:
    return SentencePairClassifier(**{**TINY, "dropout": 0.0, **overrides})


# --------------------------------------------------------------------------- encoder


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


def test_too_long_sequence_raises():
    model = TransformerEncoderModel(tiny_config())
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.ones(1, 17, dtype=torch.long))


def test_bad_config_raises():
    with pytest.raises(ValueError, match="divisible"):
        EncoderConfig(vocab_size=10, d_model=30, num_heads=4)


def test_padding_mask_makes_outputs_independent_of_padded_tokens():
    torch.manual_seed(0)
    model = TransformerEncoderModel(tiny_config()).eval()
    lengths = torch.tensor([10, 6, 3])
    mask = (torch.arange(10)[None, :] < lengths[:, None]).long()
    ids = torch.randint(1, 50, (3, 10))
    types = torch.randint(0, 2, (3, 10))
    out = model(ids, mask, types)

    # Changing what sits in the padded positions changes nothing at the real positions.
    ids2 = torch.where(mask.bool(), ids, torch.randint(1, 50, (3, 10)))
    types2 = torch.where(mask.bool(), types, 1 - types)
    out2 = model(ids2, mask, types2)
    real = mask.bool()
    torch.testing.assert_close(out[real], out2[real])

    # And the real positions equal a run on the unpadded sequence alone.
    for i, n in enumerate(lengths.tolist()):
        alone = model(ids[i : i + 1, :n], None, types[i : i + 1, :n])
        torch.testing.assert_close(out[i, :n], alone[0], atol=1e-5, rtol=1e-5)

    # Without the mask the padded tokens do leak in (the test above is not vacuous).
    leaked = model(ids2, None, types2)
    assert not torch.allclose(model(ids, None, types)[1, :6], leaked[1, :6])


def test_attention_matches_reference_softmax_attention():
    torch.manual_seed(0)
    cfg = tiny_config()
    attn = EncoderLayer(cfg).attention.eval()
    x = torch.randn(2, 7, 32)
    keep = torch.tensor([[1] * 7, [1] * 4 + [0] * 3]).bool()
    got = attn(x, keep[:, None, None, :])

    def heads(t):
        return t.view(2, 7, 4, 8).transpose(1, 2)

    q, k, v = heads(attn.query(x)), heads(attn.key(x)), heads(attn.value(x))
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 7, 32)
    torch.testing.assert_close(got, attn.output(ctx), atol=1e-5, rtol=1e-5)


def test_post_ln_structure():
    torch.manual_seed(0)
    layer = EncoderLayer(tiny_config()).eval()
    nn.init.normal_(layer.attention_norm.weight)  # non-trivial LN params so the order matters
    nn.init.normal_(layer.ffn_norm.bias)
    x = torch.randn(2, 5, 32)
    h = layer.attention_norm(x + layer.attention(x))
    ffn = layer.ffn.output(F.gelu(layer.ffn.intermediate(h)))
    torch.testing.assert_close(layer(x), layer.ffn_norm(h + ffn))

    # With fresh LayerNorms every output token is normalised (mean 0, std 1): post-LN, not pre-LN.
    y = EncoderLayer(tiny_config()).eval()(x * 10)
    torch.testing.assert_close(y.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(2, 5), atol=1e-3, rtol=0)


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


# --------------------------------------------------------------------------- param groups


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


def test_deprecated_lr_gates_warns_and_still_builds_a_gates_group():
    with pytest.warns(DeprecationWarning, match=r"ComeraCallback\(gate_lr=0.02\)"):
        model = tiny_classifier(lr_gates=0.02)
    model.backbone.encoder.layers[0].attention.query = FakeTT(32)
    groups = {g["name"]: g["lr"] for g in model.configure_optimizers().param_groups}
    assert groups["gates"] == 0.02


def test_lightning_cli_optimizer_injection():
    from lightning.pytorch.cli import LightningCLI

    args = [f"--model.{k}={v}" for k, v in TINY.items()]
    args += ["--model.optimizer=torch.optim.SGD", "--model.optimizer.lr=0.7", "--trainer.logger=false"]
    cli = LightningCLI(SentencePairClassifier, run=False, args=args, save_config_callback=None)
    opt = cli.model.configure_optimizers()
    assert type(opt) is torch.optim.SGD
    assert [g["lr"] for g in opt.param_groups] == [5e-5]  # the group lr wins over the optimizer default


# --------------------------------------------------------------------------- training


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
