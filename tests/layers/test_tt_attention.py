"""TTMultiheadAttention: nn.MultiheadAttention and nn.Transformer layers tensorized, same function at full rank."""

import pytest
import torch
from torch import nn

from comera_lightning import tensorize, to_dense
from comera_lightning.layers import TTMultiheadAttention

# Attention is named explicitly: with target_modules None it stays dense unless the defaults say otherwise.
FULL_RANK = dict(init="svd", max_rank=4096, min_compression=0.0, target_modules=["attn"])
TRANSFORMER_LAYERS = ["self_attn", "multihead_attn", "linear1", "linear2"]


def _copy(module: nn.Module) -> nn.Module:
    clone = type(module).__new__(type(module))
    clone.__dict__ = {**module.__dict__}
    return clone


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_full_rank_attention_equals_the_dense_module(batch_first, need_weights):
    torch.manual_seed(0)
    holder = nn.Module()
    holder.attn = nn.MultiheadAttention(32, 4, batch_first=batch_first).eval()
    dense = holder.attn
    q = torch.randn(3, 7, 32) if batch_first else torch.randn(7, 3, 32)
    kv = torch.randn(3, 5, 32) if batch_first else torch.randn(5, 3, 32)
    attn_mask = torch.rand(7, 5) > 0.7
    attn_mask[:, 0] = False  # every query sees at least one key
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[1, 3:] = True
    expected, expected_weights = dense(q, kv, kv, key_padding_mask=padding, attn_mask=attn_mask, need_weights=need_weights)

    report = tensorize(holder, **FULL_RANK)
    assert [r.kind for r in report.swapped] == ["mha"]
    assert isinstance(holder.attn, TTMultiheadAttention)
    out, weights = holder.attn(q, kv, kv, key_padding_mask=padding, attn_mask=attn_mask, need_weights=need_weights)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    if need_weights:
        torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-4)
    else:
        assert weights is None


def test_cross_attention_with_other_key_and_value_widths_and_back_to_dense():
    torch.manual_seed(0)
    holder = nn.Module()
    holder.attn = nn.MultiheadAttention(32, 2, kdim=24, vdim=40, batch_first=True).eval()
    q, k, v = torch.randn(2, 6, 32), torch.randn(2, 4, 24), torch.randn(2, 4, 40)
    expected = holder.attn(q, k, v)[0]
    tensorize(holder, **FULL_RANK)
    torch.testing.assert_close(holder.attn(q, k, v)[0], expected, atol=1e-5, rtol=1e-4)
    assert holder.attn.in_proj_weight is None  # no packed weight when widths differ
    to_dense(holder)
    assert type(holder.attn) is nn.MultiheadAttention
    torch.testing.assert_close(holder.attn(q, k, v)[0], expected, atol=1e-5, rtol=1e-4)


def test_causal_self_attention_and_unbatched_input():
    torch.manual_seed(0)
    holder = nn.Module()
    holder.attn = nn.MultiheadAttention(16, 2).eval()
    x = torch.randn(5, 16)  # unbatched (L, E)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    expected = holder.attn(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0]
    tensorize(holder, **FULL_RANK)
    out = holder.attn(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_layers_train_and_take_the_fused_inference_path(norm_first):
    torch.manual_seed(0)
    model = nn.Transformer(d_model=32, nhead=2, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=64,
                           dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    src, tgt = torch.randn(2, 9, 32), torch.randn(2, 6, 32)
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    with torch.no_grad():
        expected = model(src, tgt, tgt_mask=mask)
    report = tensorize(model, **{**FULL_RANK, "target_modules": TRANSFORMER_LAYERS})
    kinds = sorted(r.kind for r in report.swapped)
    assert kinds.count("mha") == 4 and kinds.count("linear") == 6, report
    assert not [name for name, reason in report.skipped if "out_proj" in name], report.skipped
    with torch.no_grad():  # eval + no grad: nn.TransformerEncoderLayer's fused kernel on the contracted weights
        torch.testing.assert_close(model(src, tgt, tgt_mask=mask), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(model(src, tgt, tgt_mask=mask), expected, atol=1e-4, rtol=1e-4)  # grad on: the trains
    model.train()
    model(src, tgt, tgt_mask=mask).square().mean().backward()
    grads = [p.grad for p in model.encoder.layers[0].self_attn.parameters()]
    assert grads and all(g is not None for g in grads)


def test_attention_with_bias_kv_is_skipped_with_the_reason():
    holder = nn.Module()
    holder.attn = nn.MultiheadAttention(64, 4, add_bias_kv=True)
    holder.ffn = nn.Linear(64, 256)
    holder.head = nn.Linear(256, 2)
    report = tensorize(holder, max_rank=4)
    skipped = dict(report.skipped)
    assert "add_bias_kv" in skipped["attn"] and "exclude_modules" in skipped["attn"]
    assert [r.name for r in report.swapped] == ["ffn"]


def test_lightning_demo_transformer_fits_with_eval_validation(tmp_path, monkeypatch):
    """Lightning's own demo nn.Transformer LM with ComeraCallback (attention named): trains, validates in eval mode, prunes."""
    monkeypatch.chdir(tmp_path)  # whatever the demo writes stays out of the checkout
    import lightning as L
    from lightning.pytorch.demos.transformer import LightningTransformer
    from torch.utils.data import DataLoader, TensorDataset

    from comera_lightning import ComeraCallback

    text = (nn.__file__.replace("__init__.py", "modules/transformer.py"))
    data = torch.tensor(list(open(text, "rb").read()[:8 * 33 * 20]), dtype=torch.long).reshape(-1, 33)  # real bytes
    pairs = TensorDataset(data[:, :-1], data[:, 1:])

    class DemoLM(LightningTransformer):
        def prepare_data(self):  # the demo downloads WikiText-2; real bytes of a local file instead
            pass

        def validation_step(self, batch, batch_idx):
            inputs, target = batch
            self.log("val/loss", nn.functional.nll_loss(self(inputs, target), target.reshape(-1)))

        def train_dataloader(self):
            return DataLoader(pairs, batch_size=8)

        def val_dataloader(self):
            return DataLoader(pairs, batch_size=16)

    L.seed_everything(0)
    module = DemoLM(vocab_size=256)
    callback = ComeraCallback(target_modules=TRANSFORMER_LAYERS)
    trainer = L.Trainer(max_epochs=3, callbacks=[callback], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu")
    trainer.fit(module)
    attention = [m for m in module.modules() if isinstance(m, TTMultiheadAttention)]
    assert len(attention) == 6  # 2 encoder self-attentions, 2 decoder self- and 2 cross-attentions
    assert callback.prune_events >= 1 and torch.isfinite(trainer.callback_metrics["val/loss"])
