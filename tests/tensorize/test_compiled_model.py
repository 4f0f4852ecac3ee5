"""A model tensorized with the defaults (token table, blocks' linear layers, vocabulary head) is one torch.compile graph.

``fullgraph=True`` raises at the first graph break, so these tests fail on any break; forward and backward are
compared with the eager model (the compiled lookups take the graph-safe routes: no id counting, no sort, no
host sync; ``docs/CUDA_GRAPHS.md``, "One graph").
"""

import copy

import pytest
import torch

from comera_lightning import TTEmbedding, TTLinear, tensorize
from tests.helpers.lm_modules import tiny_llama
from tests.helpers.zoo_steps import kill_half_the_ranks_

transformers = pytest.importorskip("transformers")


def tensorized_llama() -> torch.nn.Module:
    """A random-init LlamaForCausalLM tensorized with the defaults."""
    model = tiny_llama()
    tensorize(model)
    assert isinstance(model.model.embed_tokens, TTEmbedding) and isinstance(model.lm_head, TTLinear)
    assert isinstance(model.model.layers[0].mlp.up_proj, TTLinear)
    return model


def lm_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def ids_of(batch: int, seq: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 384, (batch, seq), generator=torch.Generator().manual_seed(seed))


def assert_same_gradients(eager: torch.nn.Module, compiled: torch.nn.Module) -> None:
    for (name, p), (_, q) in zip(eager.named_parameters(), compiled.named_parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("lookup, dead_ranks", [("auto", True), ("chain", False)])
def test_the_default_tensorized_llama_trains_as_one_graph_equal_to_eager(lookup, dead_ranks):
    eager = tensorized_llama()
    eager.model.embed_tokens.lookup_mode = lookup
    if dead_ranks:
        kill_half_the_ranks_(eager)
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True, backend="aot_eager")
    ids = ids_of(2, 16)
    loss = lm_loss(compiled, ids)
    loss.backward()
    expected = lm_loss(eager, ids)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert_same_gradients(eager, twin)
    if dead_ranks:  # a dead rank's slices get no gradient through the masked gates
        gate = twin.lm_head.gates[0]
        assert bool((gate.grad[gate.numel() // 2:] == 0).all()) and bool((gate.grad[: gate.numel() // 2] != 0).any())


def test_inference_compiles_to_one_graph_without_the_eager_caches():
    """Eval without autograd: eager serves hot rows and cached factors, the compiled graph contracts; same logits."""
    model = tensorized_llama().eval()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for seq in (16, 12):  # a new length: a recompile, still one graph
            ids = ids_of(3, seq, seed=seq)
            torch.testing.assert_close(compiled(input_ids=ids).logits, model(input_ids=ids).logits, rtol=1e-5, atol=1e-6)
    assert model.model.embed_tokens.__dict__.get("_inference_cache") is not None, "eager served from its cache"



def test_a_table_served_from_its_hot_rows_compiles_to_one_graph():
    """Eager eval serves the counted hot rows and contracts the misses through the half tables (``table_serving.py``);
    the compiled graph contracts every id; same rows."""
    table = TTEmbedding(100_000, 16, max_rank=8, num_cores=3, cache_rows=1_000)
    table.count_ids(torch.randint(0, 2_000, (5_000,), generator=torch.Generator().manual_seed(0)))
    ids = torch.randint(0, 100_000, (4, 50), generator=torch.Generator().manual_seed(1))  # mostly misses
    table.eval()
    with torch.no_grad():
        expected = table(ids)
        assert 0 < table.serving().cached_rows() <= 1_000  # (served from hot rows, not the whole table)
        compiled = torch.compile(table, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(ids), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_inductor_compiles_the_training_step_as_one_graph(mode):
    """Inductor (C++ on CPU, ~1 min); reduce-overhead is a CUDA-graph mode: on CPU it must just not break."""
    eager = tensorized_llama()
    twin = copy.deepcopy(eager)
    compiled = torch.compile(twin, fullgraph=True, mode=mode)
    ids = ids_of(2, 16)
    for _ in range(2):  # reduce-overhead records on its second call
        for model in (eager, twin):
            model.zero_grad()
        lm_loss(compiled, ids).backward()
        lm_loss(eager, ids).backward()
    assert_same_gradients(eager, twin)
