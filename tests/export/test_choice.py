"""export's ``prefer`` ("size": what was trained compressed stays compressed; "speed") and ``hot_rows``, and its report."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comera_lightning import TTEmbedding, TTLinear, export, tensorize
from comera_lightning.export import export_with_report
from comera_lightning.export.choice import embedding_form, linear_form
from comera_lightning.export.forms import CoresEmbedding, CoresLinear, FactorsEmbedding, FactorsLinear
from tests.export.test_export import TOLERANCE, run_without_comera, train_and_prune_
from tests.helpers.zoo_families import Logits

VOCAB = 3000


@pytest.fixture(scope="module")
def llama():
    """A small Llama (random init), its token table and every linear layer tensorized at rank 16, trained and pruned."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    model = Logits(transformers.LlamaForCausalLM(config), ("input_ids",))  # logits out: the program loads without transformers
    tensorize(model, max_rank=16, embedding_max_rank=16, include_attention=True, min_compression=0.0)
    ids = torch.randint(0, VOCAB, (4, 32), generator=torch.Generator().manual_seed(0))
    train_and_prune_(model, lambda m: F.cross_entropy(m(ids)[:, :-1].flatten(0, 1), ids[:, 1:].flatten()))
    # (a contiguous example: torch.export's guards of a program traced on a strided view fail on any other input)
    return model, (ids[:2, :16].clone(),), (torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(1)),)


def stored_bytes(program) -> int:
    """Bytes of the tensors an exported program holds (its state_dict and constants: the .pt2 file's weights)."""
    return sum(t.numel() * t.element_size() for t in (*program.state_dict.values(), *program.constants.values()))


def parameter_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_a_compressed_llama_exports_by_default_to_about_its_trained_parameters(llama, tmp_path):
    model, example, other = llama
    path = tmp_path / "llama.pt2"
    program = export(model, example, path)
    # The token table alone is 1.54 MB dense; the model's trained parameters (cores, gates, norms) are 0.55 MB.
    assert stored_bytes(program) <= 1.2 * parameter_bytes(model)
    with torch.no_grad():
        for batch in (example, other):
            torch.testing.assert_close(program.module()(*batch), model(*batch), **TOLERANCE)
        expected = model(*other)
    assert run_without_comera(tmp_path, path, other, expected).startswith("ok")


def test_speed_exports_the_same_outputs_and_the_report_says_what_each_layer_became(llama):
    model, example, other = llama
    size_program, size = export_with_report(model, example)
    speed_program, speed = export_with_report(model, example, prefer="speed")
    assert size.prefer == "size" and speed.prefer == "speed"
    assert size.program_bytes == stored_bytes(size_program) and size.parameter_bytes == parameter_bytes(model)
    assert [layer.name for layer in size.layers] == [layer.name for layer in speed.layers] and len(size.layers) == 16
    table = {layer.name: layer for layer in speed.layers}["model.model.embed_tokens"]
    assert table.form == "dense" and table.nbytes == VOCAB * 128 * 4 and "holds the whole table" in table.why
    assert {layer.name: layer for layer in size.layers}["model.model.embed_tokens"].form == "cores"
    assert speed.program_bytes > size.program_bytes + 1_000_000
    text = str(size)
    assert 'prefer="size"' in text and all(layer.name in text and layer.why in text for layer in size.layers)
    with torch.no_grad():
        expected = model(*other)
        torch.testing.assert_close(speed_program.module()(*other), expected, **TOLERANCE)
        torch.testing.assert_close(size_program.module()(*other), expected, **TOLERANCE)


def test_hot_rows_are_kept_only_when_asked_for_and_counted_in_the_report():
    torch.manual_seed(0)
    layer = TTEmbedding(100_000, 16, max_rank=8, num_cores=3, cache_rows=2048)
    layer(torch.randint(0, 500, (4096,)))  # a training-mode forward counts 500 distinct ids
    layer.eval()
    ids = torch.randint(0, 100_000, (300,))
    with torch.no_grad():
        expected = layer(ids)
        plain, hot, budget = embedding_form(layer), embedding_form(layer, hot_rows=True), embedding_form(layer, hot_rows=100 * 16 * 4)
        for chosen in (plain, hot, budget):
            assert isinstance(chosen.module, CoresEmbedding)
            torch.testing.assert_close(chosen.module(ids), expected, **TOLERANCE)
    assert plain.form == "cores" and plain.module.num_hot_rows == 0
    # every counted id, or a budget in bytes of rows: 100 rows of 16 floats (a few ids lose their hash slot to hotter ones)
    assert 450 <= hot.module.num_hot_rows <= 500 and hot.form == f"cores + {hot.module.num_hot_rows} hot rows"
    assert 80 <= budget.module.num_hot_rows <= 100
    speed = embedding_form(layer, "speed")  # the table's own cache_rows, and half tables instead of the cores
    assert speed.form == f"half tables + {hot.module.num_hot_rows} hot rows" and not len(speed.module.cores)
    assert "a miss is one product of 128 multiply-adds, 640 through the cores" in speed.why
    with torch.no_grad():
        torch.testing.assert_close(speed.module(ids), expected, **TOLERANCE)
    assert embedding_form(layer, "speed", hot_rows=False).form == "half tables"
    assert embedding_form(layer, "speed", miss_tables=False).form == hot.form
    two_cores = TTEmbedding(100_000, 16, max_rank=8, num_cores=2).eval()  # its half tables are its cores: nothing to gain
    assert embedding_form(two_cores, "speed", hot_rows=False).form == "cores"
    fits = embedding_form(layer, hot_rows=100_000 * 16 * 4)  # a budget that holds the whole table: the table itself
    assert isinstance(fits.module, nn.Embedding) and "whole table" in fits.why


def test_size_keeps_the_smallest_form_of_a_linear_and_speed_the_fastest():
    torch.manual_seed(0)
    layer = TTLinear(768, 768, max_rank=10, num_cores=3).eval()  # six cores: the two factors are far larger than the cores
    x = torch.randn(4, 768)
    with torch.no_grad():
        expected = layer(x)
        for tokens in (0, 4, 4096):
            chosen = linear_form(layer, tokens)
            assert isinstance(chosen.module, CoresLinear) and chosen.why.startswith("smallest: cores")
            torch.testing.assert_close(chosen.module(x), expected, **TOLERANCE)
        for tokens, kind in ((4096, CoresLinear), (4, FactorsLinear), (0, FactorsLinear)):  # re-contracting is cheap beside many rows
            chosen = linear_form(layer, tokens, "speed")
            assert isinstance(chosen.module, kind), (tokens, chosen)
            torch.testing.assert_close(chosen.module(x), expected, **TOLERANCE)
        low_rank = TTLinear(64, 64, max_rank=8, num_cores=1).eval()  # one core per side: the factors are the cores, and need no contraction
        assert linear_form(low_rank).form == "factors"
        full = TTLinear(8, 8, max_rank=64).eval()  # rank 8 of an 8x8 weight: the factors would be larger than dense
        for prefer in ("size", "speed"):
            assert isinstance(linear_form(full, 100, prefer).module, nn.Linear)
            torch.testing.assert_close(linear_form(full, 100, prefer).module(x[:, :8]), full(x[:, :8]), **TOLERANCE)


def test_a_table_pruned_to_rank_zero_exports_as_zeros_not_a_dense_table():
    layer = TTEmbedding(1_000_000, 16, max_rank=4).eval()
    with torch.no_grad():
        layer.gates[0].zero_()
        layer.prune_()
        chosen = embedding_form(layer)
        assert chosen.form == "cores" and sum(p.numel() for p in chosen.module.parameters()) < 2_000  # dense: 16M floats
        assert not chosen.module(torch.tensor([[1, 2], [3, 999_999]])).any()


def test_a_two_factor_table_exports_as_its_factors_and_serves_the_same_rows(tmp_path):
    table = TTEmbedding(5_000, 16, max_rank=4, num_cores=1, padding_idx=0).eval()
    with torch.no_grad():
        for gate in table.gates:
            gate.uniform_(0.5, 1.5)
    chosen = embedding_form(table)
    assert chosen.form == "factors" and isinstance(chosen.module, FactorsEmbedding)
    assert sum(p.numel() for p in chosen.module.parameters()) == 4 * (5_000 + 16)
    ids = torch.tensor([[0, 7], [4_999, 7]])
    with torch.no_grad():
        expected = table(ids)
        torch.testing.assert_close(chosen.module(ids), expected, **TOLERANCE)
    path = tmp_path / "table.pt2"
    program = export(nn.Sequential(table), (ids,), path)
    assert {"0.left", "0.right"} <= set(program.state_dict)
    assert run_without_comera(tmp_path, path, (ids,), expected).startswith("ok")


@pytest.mark.parametrize("options, message", [({"prefer": "fast"}, r"prefer='fast' is not one of \('size', 'speed'\)"),
                                              ({"hot_rows": -1}, "hot_rows=-1 must be"), ({"hot_rows": 1.5}, "budget in bytes")])
def test_unknown_choices_are_refused_naming_the_valid_ones(options, message):
    model = nn.Sequential(TTLinear(16, 16, max_rank=4))
    with pytest.raises(ValueError, match=message):
        export(model, (torch.randn(2, 16),), **options)


def test_a_hugging_face_model_with_its_kv_cache_on_exports_and_keeps_its_config():
    """``use_cache=True`` (transformers' default) makes a forward return a ``DynamicCache``, which torch.export cannot
    return: the exported copy serves without it, the user's model keeps it."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=2, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config)
    tensorize(model, max_rank=8, min_compression=0.0)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    program = export(model, (ids,))
    assert model.config.use_cache, "the user's model is not changed"
    with torch.no_grad():
        torch.testing.assert_close(program.module()(ids).logits, model.eval()(ids).logits, rtol=1e-4, atol=1e-5)
