"""Tests run by pytest in a fresh process under ``TRITON_INTERPRET=1`` (tests/layers/kernels/test_triton_bags.py).

The Triton kernels of the two-factor lookup equal the torch path (``reference.py``): values and factor gradients,
several shapes (odd sizes, ``tl.dot`` blocks, more ranks than one block), weighted and mean bags, empty bags, dead
ranks, half precision, inside a torch.compile graph; and the layers take them (CPU tensors take them only under the
interpreter). Triton reads the variable when ``triton.language`` is imported, hence the fresh process. With
``COMERA_KERNELS_DEVICE=cuda`` every tensor is made on the GPU and the kernels run compiled.
"""

import os

import pytest
import torch

from comera_lightning.layers.kernels import bags_reference, full_table, rows_reference, two_factor_bags, two_factor_rows

#: ``COMERA_KERNELS_DEVICE=cuda``: the same tests on a GPU, the kernels compiled by Triton (``make test-gpu``).
ON_CUDA = os.environ.get("COMERA_KERNELS_DEVICE") == "cuda"
if os.environ.get("TRITON_INTERPRET") != "1" and not ON_CUDA:
    pytest.skip("run under TRITON_INTERPRET=1 (or COMERA_KERNELS_DEVICE=cuda) by tests/layers/kernels/test_triton_bags.py",
                allow_module_level=True)
if ON_CUDA:
    torch.set_default_device("cuda")


@pytest.fixture(autouse=True)
def _kernels_for_every_lookup(monkeypatch):
    """These tables are small beside their lookups, where the whole table would take over (tests/layers/kernels/test_full_table.py)."""
    monkeypatch.setattr(full_table, "ROWS_PER_LOOKUP", 0)


#: (N_L, M_L, r, N_R, M_R): odd sizes (masked blocks), 8x8 at rank 32 (the 1Mx64 table's slices), tl.dot's blocks,
#: a rank of several blocks (16 x 128 x 16 holds more than one tile), a rank of 1.
SHAPES = [(7, 3, 5, 9, 6), (10, 8, 32, 12, 8), (5, 16, 32, 6, 16), (4, 16, 128, 3, 16), (6, 4, 1, 5, 2)]


def _factors(shape, dtype=torch.float32):
    n_left, m_left, rank, n_right, m_right = shape
    left = torch.randn(n_left, m_left, rank, dtype=dtype, requires_grad=True)
    right = torch.randn(n_right, rank, m_right, dtype=dtype, requires_grad=True)
    return left, right


def _bags(shape, lengths):
    ids = torch.randint(0, shape[0] * shape[3], (int(sum(lengths)),))
    return ids, torch.tensor(lengths, dtype=torch.long)


def _assert_same(fused, reference, inputs, tol=1e-5):
    """Equal values, and equal gradients of ``inputs`` for one random output gradient."""
    assert fused.grad_fn is not None and "two_factor_bags" in type(fused.grad_fn).__name__, "the kernel did not run"
    torch.testing.assert_close(fused, reference, rtol=tol, atol=tol)
    grad = torch.randn_like(reference)
    for got, want in zip(torch.autograd.grad(fused, inputs, grad), torch.autograd.grad(reference, inputs, grad)):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mean, weighted", [(False, False), (True, True)])
def test_pooled_bags_equal_the_torch_path(shape, mean, weighted):
    left, right = _factors(shape)
    ids, lengths = _bags(shape, [3, 0, 1, 5, 0, 2])  # two empty bags
    weights = torch.rand(ids.numel()) if weighted else None
    fused = two_factor_bags(left, right, ids, lengths, weights, mean=mean)
    _assert_same(fused, bags_reference(left, right, ids, lengths, weights, mean=mean), (left, right))


@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda s: "x".join(map(str, s)))
def test_rows_equal_the_torch_path_with_repeated_ids(shape):
    left, right = _factors(shape)
    ids = torch.tensor([0, 3, 3, shape[0] * shape[3] - 1, 3], dtype=torch.int32)  # repeats accumulate in the backward
    _assert_same(two_factor_rows(left, right, ids), rows_reference(left, right, ids.long()), (left, right))


def test_dead_ranks_get_no_gradient_and_the_rest_equal_the_torch_path():
    """Gated factors (a dead gate zeroes its rank's slices) as a TT layer hands them over: gradients reach core and gate."""
    left, right = _factors((6, 4, 8, 7, 4))
    gate = torch.tensor([1.0, 0.5, 0.0, 2.0, 0.0, 1.0, 1.0, 0.3], requires_grad=True)
    ids, lengths = _bags((6, 4, 8, 7, 4), [4, 2, 3])
    fused = two_factor_bags(left * gate, right, ids, lengths)
    _assert_same(fused, bags_reference(left * gate, right, ids, lengths), (left, right, gate))
    two_factor_bags(left * gate, right, ids, lengths).sum().backward()
    assert bool((left.grad[..., gate == 0] == 0).all()) and bool((left.grad[..., gate != 0] != 0).any())


def test_only_empty_bags_and_no_bags():
    left, right = _factors((3, 4, 4, 3, 4))
    out = two_factor_bags(left, right, torch.zeros(0, dtype=torch.long), torch.zeros(4, dtype=torch.long), mean=True)
    assert out.shape == (4, 16) and not out.any()
    out.sum().backward()
    assert not left.grad.any() and not right.grad.any()
    assert two_factor_bags(left, right, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)).shape == (0, 16)


def test_half_precision_factors_accumulate_in_float32():
    left, right = _factors((5, 8, 16, 4, 8), dtype=torch.bfloat16)
    ids, lengths = _bags((5, 8, 16, 4, 8), [6, 3])
    fused = two_factor_bags(left, right, ids, lengths)
    assert fused.dtype == torch.bfloat16
    exact = bags_reference(left.float(), right.float(), ids, lengths)
    torch.testing.assert_close(fused.float(), exact, rtol=1e-2, atol=1e-2)  # the output's own rounding


def test_the_kernel_is_one_node_of_a_compiled_graph():
    left, right = _factors((10, 8, 32, 12, 8))
    ids, lengths = _bags((10, 8, 32, 12, 8), [3, 0, 4])

    def loss(a, b):
        return two_factor_bags(a * 2, b, ids, lengths, mean=True).square().sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(left, right), (left, right))
    want = torch.autograd.grad(loss(left, right), (left, right))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def _runs_kernel(output: torch.Tensor) -> bool:
    """Whether the fused op is in ``output``'s autograd graph."""
    seen, stack = set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "two_factor_bags" in type(node).__name__:
            return True
        stack.extend(next_node for next_node, _ in node.next_functions)
    return False


@pytest.mark.parametrize("num_cores, lookup, fused", [(2, "auto", True), (2, "chain", True), (3, "tables", True), (3, "chain", False)])
def test_tt_embedding_takes_the_kernel_for_two_factors_and_equals_its_dense_table(num_cores, lookup, fused):
    from comera_lightning import TTEmbedding

    layer = TTEmbedding(300, 24, max_rank=8, num_cores=num_cores, lookup=lookup, padding_idx=2)
    with torch.no_grad():
        layer.gates[0][::3] = 0.0  # dead ranks
    ids = torch.tensor([[0, 2, 299, 17], [17, 5, 0, 150]])
    rows = layer(ids)
    assert _runs_kernel(rows) == fused
    expected = layer.weight_table()[ids]
    torch.testing.assert_close(rows, expected, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(rows)
    params = [*layer.cores, *layer.gates]
    for got, want in zip(torch.autograd.grad(rows, params, grad), torch.autograd.grad(expected, params, grad)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("weighted", [False, True])
def test_the_bag_collection_pools_tt_tables_with_the_kernel_like_its_torch_path(monkeypatch, weighted):
    torchrec = pytest.importorskip("torchrec")
    from comera_lightning import TTEmbeddingBagCollection

    tables = [torchrec.EmbeddingBagConfig(name="big", embedding_dim=12, num_embeddings=1500, feature_names=["a", "b"]),
              torchrec.EmbeddingBagConfig(name="mean", embedding_dim=8, num_embeddings=2000, feature_names=["c"],
                                          pooling=torchrec.PoolingType.MEAN),
              torchrec.EmbeddingBagConfig(name="small", embedding_dim=4, num_embeddings=40, feature_names=["d"])]
    collection = TTEmbeddingBagCollection(tables, max_rank=6, num_cores=2, is_weighted=weighted)
    lengths = torch.tensor([2, 0, 3, 1, 1, 1, 0, 4, 2, 2, 1, 0])  # 4 features x 3 bags, empty bags among them
    values = torch.cat([torch.randint(0, top, (int(n),)) for top, n in zip((1500, 1500, 2000, 40), lengths.view(4, 3).sum(1))])
    weights = torch.rand(values.numel()) if weighted else None
    features = torchrec.KeyedJaggedTensor(keys=["a", "b", "c", "d"], values=values, lengths=lengths, weights=weights)
    fused = collection(features).values()
    assert _runs_kernel(fused)
    params = list(collection.parameters())
    grad = torch.randn_like(fused)
    got = torch.autograd.grad(fused, params, grad)
    monkeypatch.delenv("TRITON_INTERPRET")  # CPU tensors take the torch path again
    torch_path = collection(features).values()
    assert not _runs_kernel(torch_path)
    torch.testing.assert_close(fused, torch_path, rtol=1e-5, atol=1e-5)
    for g, w in zip(got, torch.autograd.grad(torch_path, params, grad)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_an_exported_program_holds_no_kernel():
    """torch.export keeps the torch path: a program must load and run with torch alone."""
    from comera_lightning import TTEmbedding

    layer = TTEmbedding(300, 24, max_rank=8, num_cores=2).eval()
    ids = torch.tensor([[1, 2, 299]])
    program = torch.export.export(layer, (ids,))
    assert "comera" not in str(program.graph)
    torch.testing.assert_close(program.module()(ids), layer.weight_table()[ids].detach())
