"""Cached inference in the TT layers: reused while nothing changes, never stale after a step, prune, load or train()."""

import copy
import pickle

import pytest
import torch
from torch import nn

from comera_lightning import tensorize
from comera_lightning.rank import prune_, tt_layers


class TokenModel(nn.Module):
    """Embedding -> linear -> GELU -> linear, tensorized below (TTEmbedding + two TTLinear)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(2000, 48)
        self.up = nn.Linear(48, 96)
        self.down = nn.Linear(96, 48)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(self.embed(ids))))


def token_model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = TokenModel()
    tensorize(model, max_rank=8, embedding_max_rank=8, init="random", min_compression=0.0)
    return model, torch.randint(0, 2000, (3, 5))


def conv1d_model() -> tuple[nn.Module, torch.Tensor]:
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    model = nn.Sequential(Conv1D(96, 48), nn.GELU(), Conv1D(48, 96))
    tensorize(model, max_rank=8, init="random", target_modules=["0", "2"], min_compression=0.0)
    return model, torch.randn(4, 48)


class PooledModel(nn.Module):
    """A TTEmbeddingBagCollection whose pooled values feed a linear head."""

    def __init__(self) -> None:
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

        tables = [EmbeddingBagConfig(name="t0", embedding_dim=16, num_embeddings=3000, feature_names=["f0"]),
                  EmbeddingBagConfig(name="t1", embedding_dim=16, num_embeddings=10, feature_names=["f1"])]
        self.ebc = EmbeddingBagCollection(tables=tables)
        self.head = nn.Linear(32, 1)

    def forward(self, kjt) -> torch.Tensor:
        return self.head(self.ebc(kjt).values())


def ebc_model() -> tuple[nn.Module, object]:
    pytest.importorskip("torchrec")
    from torchrec import KeyedJaggedTensor

    torch.manual_seed(0)
    model = PooledModel()
    # the half-table lookup also with grad on (the test counts its contractions)
    tensorize(model, max_rank=8, init="random", target_modules=["ebc"], min_compression=0.0, layer_config={"ebc": {"lookup": "tables"}})
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1"], values=torch.tensor([5, 2999, 7, 1, 3, 4, 9]), lengths=torch.tensor([2, 1, 1, 1, 1, 1])
    )
    return model, kjt


BUILDERS = {"token": token_model, "conv1d": conv1d_model, "ebc": ebc_model}


def reference(model: nn.Module, inputs) -> torch.Tensor:
    """The output computed from the cores now (grad mode on: nothing is cached)."""
    with torch.enable_grad():
        return model(inputs).detach()


def cached_output(model: nn.Module, inputs, mode: str = "no_grad") -> torch.Tensor:
    context = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with context:
        return model(inputs).clone()


def assert_fresh(model: nn.Module, inputs, mode: str = "no_grad") -> torch.Tensor:
    model.eval()
    out = cached_output(model, inputs, mode)
    torch.testing.assert_close(out, reference(model, inputs), rtol=0, atol=0)
    torch.testing.assert_close(cached_output(model, inputs, mode), out, rtol=0, atol=0)  # served from the cache
    return out


def train_step(model: nn.Module, inputs, optimizer: torch.optim.Optimizer, mode: bool = True) -> None:
    """One step; ``mode=False`` steps in eval mode, so only the parameters' in-place change can invalidate the cache."""
    model.train(mode)
    model(inputs).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def count_contractions(model: nn.Module) -> list[int]:
    """Wrap each TT layer's public ``halves``/``half_tables`` to count how often the cores are contracted."""
    calls = [0]
    for _, layer in tt_layers(model):
        name = "half_tables" if hasattr(layer, "half_tables") else "halves"
        original = getattr(layer, name)

        def counted(*args, _original=original, **kwargs):
            calls[0] += 1
            return _original(*args, **kwargs)

        setattr(layer, name, counted)
    return calls


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_eval_reuses_the_contracted_factors(kind):
    model, inputs = BUILDERS[kind]()
    model.eval()
    calls = count_contractions(model)
    first = cached_output(model, inputs)
    after_first = calls[0]
    assert after_first > 0
    for mode in ("no_grad", "no_grad", "inference_mode", "inference_mode"):
        torch.testing.assert_close(cached_output(model, inputs, mode), first, rtol=0, atol=0)
    assert calls[0] == after_first + after_first, "one rebuild on entering inference_mode, none otherwise"
    with torch.enable_grad():  # autograd needs the graph: computed from the cores, never cached
        out = model(inputs)
    assert out.requires_grad and calls[0] == 3 * after_first
    out.sum().backward()
    assert all(p.grad is not None for _, layer in tt_layers(model) for p in layer.cores)


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_cached_eval_is_never_stale(kind):
    model, inputs = BUILDERS[kind]()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = assert_fresh(model, inputs)

    train_step(model, inputs, optimizer, mode=False)  # in-place optimizer step, no train() call
    after_step = assert_fresh(model, inputs)
    assert not torch.equal(after_step, before)

    with torch.no_grad():  # a late-stage state: gates zeroed in place, then pruned through the public path
        for _, layer in tt_layers(model):
            for gate in layer.gates:
                gate[gate.numel() // 2:] = 0.0
    zeroed = assert_fresh(model, inputs)
    assert not torch.equal(zeroed, after_step)
    assert prune_(model, [optimizer]).removed
    torch.testing.assert_close(assert_fresh(model, inputs), zeroed, rtol=1e-5, atol=1e-6)

    other, _ = BUILDERS[kind]()
    train_step(other, inputs, torch.optim.SGD(other.parameters(), lr=0.5))
    model.load_state_dict(other.state_dict())  # copy_ into the resized parameters
    other.eval()
    torch.testing.assert_close(assert_fresh(model, inputs), cached_output(other, inputs), rtol=0, atol=0)

    train_step(model, inputs, optimizer)  # train(), then a step that changes the cores again
    assert_fresh(model, inputs, "inference_mode")


def test_copies_and_pickles_do_not_share_the_cache():
    model, inputs = token_model()
    out = assert_fresh(model, inputs)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for _, layer in tt_layers(clone):
            layer.cores[0].mul_(2.0)
    assert not torch.equal(cached_output(clone, inputs), out)
    torch.testing.assert_close(cached_output(model, inputs), out, rtol=0, atol=0)
    restored = pickle.loads(pickle.dumps(model))
    torch.testing.assert_close(cached_output(restored, inputs), out, rtol=0, atol=0)


def test_replacing_data_or_casting_invalidates():
    model, inputs = token_model()
    assert_fresh(model, inputs)
    layer = dict(tt_layers(model))["up"]
    layer.cores[1].data = layer.cores[1].data * 3.0  # no version bump: a new storage
    assert_fresh(model, inputs)
    model.double()
    out = assert_fresh(model, inputs)
    assert out.dtype == torch.float64
