"""The CPU dropout of the encoder: right keep rate, unbiased, masked gradient, seeded, SDPA-equal attention."""

import pytest
import torch
import torch.nn.functional as F

from comera_lightning.models.dropout import Dropout, dropout, keep_mask
from comera_lightning.models.encoder import EncoderConfig, SelfAttention


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_and_scale_match_p(p):
    torch.manual_seed(0)
    mask, scale = keep_mask(torch.Size([1000, 1001]), p)
    kept = mask.float().mean().item()
    sigma = (p * (1 - p) / mask.numel()) ** 0.5
    assert abs(kept - (1 - p)) < 5 * sigma + 2**-16
    assert scale == pytest.approx(1 / (1 - p), rel=1e-4)
    assert mask.dtype == torch.bool and mask.shape == (1000, 1001)


def test_output_is_unbiased_and_gradient_uses_the_same_mask():
    torch.manual_seed(1)
    x = torch.full((400, 500), 2.0, requires_grad=True)
    y = dropout(x, 0.3)
    y.backward(torch.ones_like(y))
    assert y.mean().item() == pytest.approx(2.0, rel=0.01)
    dropped = y == 0
    assert 0.29 < dropped.float().mean().item() < 0.31
    assert torch.equal(x.grad == 0, dropped)
    assert torch.allclose(y[~dropped] / 2.0, x.grad[~dropped])


def test_identity_when_not_training_or_p_zero_and_reproducible_under_a_seed():
    x = torch.randn(8, 16)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    module = Dropout(0.5).eval()
    assert module(x) is x
    torch.manual_seed(3)
    first = dropout(x, 0.5)
    torch.manual_seed(3)
    assert torch.equal(first, dropout(x, 0.5))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        Dropout(1.0)


def test_bfloat16_keeps_its_dtype():
    x = torch.randn(64, 64, dtype=torch.bfloat16, requires_grad=True)
    y = dropout(x, 0.2)
    y.sum().backward()
    assert y.dtype == x.grad.dtype == torch.bfloat16


def test_training_attention_path_equals_sdpa_when_nothing_is_dropped():
    torch.manual_seed(0)
    attention = SelfAttention(EncoderConfig(d_model=32, num_heads=4, d_ff=64, dropout=0.1)).train()
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    keep = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    keep[1, ..., 4:] = False  # padding in the second sequence
    attention.dropout_p = 1e-9  # rounds to keep probability 1: the mask keeps everything
    ours = attention._attend_with_cpu_dropout(q, k, v, keep)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert torch.allclose(ours, reference, atol=1e-6)


def test_training_attention_drops_probabilities_at_rate_p():
    torch.manual_seed(0)
    attention = SelfAttention(EncoderConfig(d_model=64, num_heads=4, d_ff=64, dropout=0.25)).train()
    q = torch.zeros(8, 4, 32, 16)  # uniform attention: every probability is 1/32 before dropout
    probs = attention._attend_with_cpu_dropout(q, q, torch.eye(32).expand(8, 4, 32, 32), None)
    assert 0.23 < (probs == 0).float().mean().item() < 0.27
    assert torch.allclose(probs[probs != 0], torch.tensor(1 / 32 / 0.75))


def test_tiny_p_keeps_everything():
    mask, scale = keep_mask(torch.Size([1000]), 1e-9)
    assert mask.all() and scale == 1.0


def test_compiled_it_breaks_no_graph():
    """Dynamo cannot trace the CPU mask's in-place draw; a compiled graph takes ``F.dropout`` (it broke at every dropout)."""
    torch._dynamo.reset()
    encoder_attention = SelfAttention(EncoderConfig(d_model=32, num_heads=4, d_ff=64, dropout=0.1)).train()
    x = torch.randn(2, 8, 32)
    for function in (lambda t: dropout(t, 0.5), encoder_attention):
        explained = torch._dynamo.explain(function)(x)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
