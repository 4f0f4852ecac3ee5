"""Hugging Face models under tensorize: Conv1D exact at full rank and exported back; tied weights stay tied."""


import pytest
import torch
from torch import nn

from comera_lightning import tensorize, to_dense

transformers = pytest.importorskip("transformers")


def test_conv1d_is_exact_at_full_rank_and_exports_back_to_conv1d():
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    model = nn.Sequential(Conv1D(96, 48), nn.GELU(), Conv1D(48, 96))
    x = torch.randn(5, 7, 48)
    expected = model(x)
    report = tensorize(model, init="svd", max_rank=10_000, target_modules=["0", "2"], min_compression=0.0)
    assert [r.kind for r in report.swapped] == ["conv1d", "conv1d"]
    torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)
    assert to_dense(model) == ["0", "2"] and all(isinstance(model[i], Conv1D) for i in (0, 2))
    torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["gpt2_lm", "bert_mlm"])
def test_tied_weights_are_never_untied_and_the_report_says_why(kind):
    torch.manual_seed(0)
    if kind == "gpt2_lm":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=64, n_layer=1, n_head=2, vocab_size=2048))
        embedding, head = "transformer.wte", "lm_head"
    else:
        config = transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=256, vocab_size=2048)
        model = transformers.BertForMaskedLM(config)
        embedding, head = "bert.embeddings.word_embeddings", "cls.predictions.decoder"
    report = tensorize(model, max_rank=8)
    skipped = dict(report.skipped)
    assert "tied" in skipped[embedding] and "tied" in skipped[head]
    assert model.get_submodule(head).weight is model.get_submodule(embedding).weight
    assert report.swapped, "the other layers are still tensorized"
