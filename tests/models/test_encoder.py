"""The BERT-style encoder: shapes, masks, attention, post-LN."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comera_lightning.models import EncoderConfig, EncoderLayer, TransformerEncoderModel

TINY = dict(vocab_size=50, d_model=32, num_layers=2, num_heads=4, d_ff=64, max_positions=16)


def tiny_config(**overrides) -> EncoderConfig:
    return EncoderConfig(**{**TINY, "dropout": 0.0, **overrides})


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
