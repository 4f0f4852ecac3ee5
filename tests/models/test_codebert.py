"""Tests of the CodeBERT-like masked LM: weight tying, masked loss, exact perplexity, training, checkpoints."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comera_lightning import TTEmbedding, tensorize
from comera_lightning.data.code import CodeCorpusDataModule
from comera_lightning.models.codebert import (
    MaskedLanguageModel,
    MaskedTokenPerplexity,
    warmup_schedule_factor,
)

VOCAB = 300
TINY = dict(vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4, d_ff=64, max_positions=64, dropout=0.0)


def tiny_model(**overrides) -> MaskedLanguageModel:
    return MaskedLanguageModel(**{**TINY, **overrides})


def random_batch(batch: int = 3, seq: int = 16, mask_every: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (batch, seq), generator=gen)
    labels = torch.full_like(ids, -100)
    labels[:, ::mask_every] = ids[:, ::mask_every]
    attention = torch.ones_like(ids, dtype=torch.bool)
    attention[-1, -3:] = False
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


# --------------------------------------------------------------------------- tying


def test_tied_decoder_is_the_embedding_parameter_and_tensorize_skips_both() -> None:
    model = tiny_model()
    embedding = model.backbone.embeddings.word_embeddings
    assert model.word_embeddings_tied
    assert model.lm_head.decoder.weight is embedding.weight
    assert model.lm_head.decoder.bias is not None  # the bias is never tied
    assert sum(p is embedding.weight for p in model.parameters()) == 1  # counted once
    assert torch.count_nonzero(embedding.weight[model.hparams.pad_token_id]) == 0  # init kept the pad row

    report = tensorize(model, max_rank=4)
    skipped = dict(report.skipped)
    assert "tied" in skipped["backbone.embeddings.word_embeddings"]
    assert "lm_head.decoder" in skipped
    assert isinstance(model.backbone.embeddings.word_embeddings, nn.Embedding)
    assert model.word_embeddings_tied


def test_untie_gives_separate_storage_with_equal_values_and_allows_tensorize() -> None:
    model = tiny_model()
    embedding_weight = model.backbone.embeddings.word_embeddings.weight
    model.untie_word_embeddings()
    decoder_weight = model.lm_head.decoder.weight
    assert not model.word_embeddings_tied and model.hparams.tie_word_embeddings is False
    assert decoder_weight is not embedding_weight
    assert decoder_weight.data_ptr() != embedding_weight.data_ptr()
    torch.testing.assert_close(decoder_weight, embedding_weight, rtol=0, atol=0)
    with torch.no_grad():
        decoder_weight.add_(1.0)
    assert not torch.equal(decoder_weight, embedding_weight)

    tensorize(model, target_modules=["word_embeddings"], max_rank=4, min_compression=0)
    assert isinstance(model.backbone.embeddings.word_embeddings, TTEmbedding)
    assert not model.word_embeddings_tied
    logits = model(random_batch()["input_ids"])
    assert logits.shape == (3, 16, VOCAB)


def test_untied_model_has_own_decoder_and_tensorizes_embedding() -> None:
    model = tiny_model(tie_word_embeddings=False)
    assert not model.word_embeddings_tied
    report = tensorize(model, max_rank=4, include_embeddings=True)  # untied: the table can be tensorized
    assert {"backbone.embeddings.word_embeddings", "lm_head.decoder"} <= {r.name for r in report.swapped}  # a vocabulary head
    kept = tiny_model(tie_word_embeddings=False)
    tensorize(kept, max_rank=4, include_heads=False)
    assert isinstance(kept.lm_head.decoder, nn.Linear)


# --------------------------------------------------------------------------- loss and metrics


@pytest.mark.parametrize("masked_only", [True, False])
def test_loss_counts_only_masked_positions(masked_only: bool) -> None:
    model = tiny_model(head_on_masked_only=masked_only).eval()
    batch = random_batch()
    loss_sum, count, _, _ = model.masked_lm_loss(batch)
    selected = batch["labels"] != -100
    logits = model(batch["input_ids"], batch["attention_mask"])
    expected = F.cross_entropy(logits[selected], batch["labels"][selected], reduction="sum")
    assert int(count) == int(selected.sum())
    torch.testing.assert_close(loss_sum, expected, rtol=1e-5, atol=1e-4)

    # training_step returns the mean over the predicted tokens (no trainer attached: self.log only warns).
    with pytest.warns(UserWarning, match="self.log"):
        loss = model.training_step(batch, 0)
    torch.testing.assert_close(loss, expected / count, rtol=1e-5, atol=1e-5)


def test_unmasked_positions_get_no_gradient() -> None:
    model = tiny_model(head_on_masked_only=False).eval()
    batch = random_batch()
    hidden = model.backbone(batch["input_ids"], batch["attention_mask"]).detach().requires_grad_(True)
    logits = model.lm_head(hidden)
    selected = batch["labels"] != -100
    F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100).backward()
    assert torch.all(hidden.grad[~selected] == 0)
    assert torch.all(hidden.grad[selected].abs().sum(-1) > 0)


def test_perplexity_is_exp_of_mean_token_loss_across_batches() -> None:
    model = tiny_model().eval()
    batches = [random_batch(batch=2, mask_every=2, seed=1), random_batch(batch=3, mask_every=5, seed=2)]
    metric = MaskedTokenPerplexity()
    token_losses, batch_ppls = [], []
    with torch.no_grad():
        for batch in batches:
            loss_sum, count, _, _ = model.masked_lm_loss(batch)
            metric.update(loss_sum, count)
            selected = batch["labels"] != -100
            logits = model(batch["input_ids"], batch["attention_mask"])
            losses = F.cross_entropy(logits[selected], batch["labels"][selected], reduction="none")
            token_losses.append(losses)
            batch_ppls.append(losses.mean().exp())
    counts = [len(t) for t in token_losses]
    assert counts[0] != counts[1]
    expected = torch.cat(token_losses).double().mean().exp()
    torch.testing.assert_close(metric.compute().double(), expected, rtol=1e-5, atol=0)
    assert not math.isclose(float(torch.stack(batch_ppls).mean()), float(expected), rel_tol=1e-4)


def test_schedule_factor_and_argument_checks() -> None:
    assert warmup_schedule_factor(0, 4, None) == pytest.approx(0.25)
    assert warmup_schedule_factor(3, 4, None) == 1.0
    assert warmup_schedule_factor(100, 4, None) == 1.0
    assert warmup_schedule_factor(4, 4, 14) == 1.0
    assert warmup_schedule_factor(9, 4, 14) == pytest.approx(0.5)
    assert warmup_schedule_factor(20, 4, 14) == 0.0
    model = tiny_model(warmup_steps=2, lr_decay="linear", total_steps=10)
    config = model.configure_optimizers()
    scheduler = config["lr_scheduler"]["scheduler"]
    assert isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR)
    assert [g["name"] for g in config["optimizer"].param_groups] == ["other"]
    assert config["optimizer"].param_groups[0]["lr"] == pytest.approx(model.hparams.lr_other * 0.5)
    assert isinstance(tiny_model().configure_optimizers(), torch.optim.Optimizer)
    with pytest.raises(ValueError, match="lr_decay"):
        tiny_model(lr_decay="cosine")
    with pytest.raises(ValueError, match="not both"):
        tiny_model(warmup_steps=5, scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1))


# --------------------------------------------------------------------------- training on the code corpus


@pytest.fixture(scope="module")
def code_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CodeCorpusDataModule]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMERA_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        dm = CodeCorpusDataModule(max_files=12, vocab_size=VOCAB, block_size=32, batch_size=8,
                                  val_fraction=0.2, test_fraction=0.1, seed=0)
        dm.prepare_data()
        dm.setup("fit")
        yield dm


def test_loss_decreases_on_a_fixed_corpus_batch(code_data: CodeCorpusDataModule) -> None:
    assert code_data.vocab_size <= VOCAB
    model = tiny_model(pad_token_id=code_data.pad_token_id, lr_other=3e-3)
    batch = next(iter(code_data.train_dataloader()))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    optimizer = model.configure_optimizers()
    model.train()
    losses = []
    for _ in range(25):
        loss_sum, count, _, _ = model.masked_lm_loss(batch)
        loss = loss_sum / count
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_fit_logs_metrics_and_checkpoint_round_trips(code_data: CodeCorpusDataModule, tmp_path: Path) -> None:
    pl.seed_everything(0)
    model = tiny_model(pad_token_id=code_data.pad_token_id, warmup_steps=2, lr_decay="linear")
    trainer = pl.Trainer(
        max_steps=6, limit_val_batches=3, limit_test_batches=2, val_check_interval=6, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path, accelerator="cpu", devices=1,
    )
    trainer.fit(model, datamodule=code_data)
    logged = trainer.callback_metrics
    for key in ("train/loss", "train/acc", "train/ppl", "val/loss", "val/acc", "val/ppl"):
        assert key in logged and torch.isfinite(logged[key]), key
    torch.testing.assert_close(logged["val/ppl"], logged["val/loss"].exp(), rtol=1e-5, atol=0)
    assert 0.0 <= float(logged["val/acc"]) <= 1.0

    path = tmp_path / "mlm.ckpt"
    trainer.save_checkpoint(path)
    restored = MaskedLanguageModel.load_from_checkpoint(path)
    assert restored.word_embeddings_tied and restored.hparams == model.hparams
    for (name, a), (_, b) in zip(model.state_dict().items(), restored.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    batch = next(iter(code_data.val_dataloader()))
    model.eval(), restored.eval()
    with torch.no_grad():
        torch.testing.assert_close(restored(batch["input_ids"], batch["attention_mask"]),
                                   model(batch["input_ids"], batch["attention_mask"]))

    results = trainer.test(model, datamodule=code_data, verbose=False)[0]
    assert {"test/loss", "test/acc", "test/ppl"} <= set(results)


@pytest.mark.parametrize("how", ["method", "by_hand"])
def test_untied_checkpoint_reloads_untied(tmp_path: Path, how: str) -> None:
    model = tiny_model()
    if how == "method":
        model.untie_word_embeddings()
    else:  # the hparams still say tied: on_save_checkpoint must record the real state
        model.lm_head.decoder.weight = nn.Parameter(model.lm_head.decoder.weight.detach().clone())
    with torch.no_grad():
        model.lm_head.decoder.weight.mul_(2.0)
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         default_root_dir=tmp_path, accelerator="cpu", devices=1)
    trainer.strategy.connect(model)
    path = tmp_path / "untied.ckpt"
    trainer.save_checkpoint(path)
    restored = MaskedLanguageModel.load_from_checkpoint(path)
    assert not restored.word_embeddings_tied
    torch.testing.assert_close(restored.lm_head.decoder.weight, model.lm_head.decoder.weight, rtol=0, atol=0)
    torch.testing.assert_close(restored.backbone.embeddings.word_embeddings.weight,
                               model.backbone.embeddings.word_embeddings.weight, rtol=0, atol=0)
