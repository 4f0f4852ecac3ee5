"""The race's models: random-init Hugging Face causal LMs, the low-rank baseline's layers, the narrow width search."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

FAMILIES = ("llama", "gpt2")


@dataclass(frozen=True)
class ModelSpec:
    """A Hugging Face causal LM: ``family`` (llama or gpt2), width (hidden size), number of blocks; ``ffn``: the
    Llama MLP's width where a published shape fixes it (LLaMA-60M: 1,376), else the rule of ``build_lm``."""

    family: str
    width: int
    layers: int
    ffn: int | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown model family {self.family!r}; choose one of {FAMILIES}")

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """``"llama:256:4"`` -> ModelSpec("llama", 256, 4)."""
        try:
            family, width, layers = text.strip().split(":")
            return cls(family, int(width), int(layers))
        except ValueError as error:
            raise ValueError(f"model {text!r}: expected family:width:layers, e.g. llama:256:4 ({error})") from None

    def label(self) -> str:
        return f"{self.family}-{self.width}x{self.layers}"

    def with_width(self, width: int) -> ModelSpec:
        return replace(self, width=width)


def attention_heads(width: int) -> int:
    """Heads of about 64 dimensions that divide ``width`` into even head sizes (rotary embeddings need them)."""
    for heads in range(max(1, width // 64), 0, -1):
        if width % heads == 0 and (width // heads) % 2 == 0:
            return heads
    return 1


def build_lm(spec: ModelSpec, vocab_size: int, block_size: int) -> nn.Module:
    """A random-init causal LM of ``spec`` (no download); MLP 4× (GPT-2) or 8/3× rounded to 64 (Llama), untied head."""
    import transformers as tf

    heads = attention_heads(spec.width)
    if spec.family == "llama":
        intermediate = spec.ffn or 64 * math.ceil(spec.width * 8 / 3 / 64)
        config = tf.LlamaConfig(vocab_size=vocab_size, hidden_size=spec.width, intermediate_size=intermediate,
                                num_hidden_layers=spec.layers, num_attention_heads=heads, num_key_value_heads=heads,
                                max_position_embeddings=block_size, tie_word_embeddings=False,
                                bos_token_id=0, eos_token_id=2, pad_token_id=1)
        return tf.LlamaForCausalLM(config)
    config = tf.GPT2Config(vocab_size=vocab_size, n_embd=spec.width, n_layer=spec.layers, n_head=heads,
                           n_positions=block_size, tie_word_embeddings=False, bos_token_id=0, eos_token_id=2)
    return tf.GPT2LMHeadModel(config)


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def dense_parameters(spec: ModelSpec, vocab_size: int, block_size: int) -> int:
    """Parameters of ``build_lm(spec, ...)``, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return parameters(build_lm(spec, vocab_size, block_size))


def narrow_width(spec: ModelSpec, target_params: int, vocab_size: int, block_size: int, multiple: int = 16) -> int:
    """The width (a multiple of ``multiple``, at most ``spec.width``) whose dense model is closest to ``target_params``."""
    widths = range(multiple, spec.width + 1, multiple)
    return min(widths, key=lambda w: abs(dense_parameters(spec.with_width(w), vocab_size, block_size) - target_params))


# ---------------------------------------------------------------------------- the low-rank baseline
def _factor_std(std: float, rank: int) -> float:
    """Each factor's std so that their product has ``std`` (entries of U·V sum ``rank`` products)."""
    return math.sqrt(std / math.sqrt(rank))


class LowRankLinear(nn.Module):
    """``y = (x U) V + b``: a plain rank-``rank`` factorisation of a linear map (the low-rank baseline)."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool, std: float) -> None:
        super().__init__()
        self.u = nn.Parameter(torch.randn(in_features, rank) * _factor_std(std, rank))
        self.v = nn.Parameter(torch.randn(rank, out_features) * _factor_std(std, rank))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x @ self.u) @ self.v
        return y + self.bias if self.bias is not None else y


class LowRankEmbedding(nn.Module):
    """An embedding table ``A·B`` of rank ``rank`` (rows of ``A`` looked up, then mapped by ``B``)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, rank: int, std: float) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(num_embeddings, rank) * _factor_std(std, rank))
        self.b = nn.Parameter(torch.randn(rank, embedding_dim) * _factor_std(std, rank))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.a) @ self.b


def linear_like(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) of an ``nn.Linear`` or a Hugging Face ``Conv1D``; None for anything else."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D":
        return tuple(module.weight.shape)
    return None


def block_linears(model: nn.Module) -> list[str]:
    """The linear maps inside the transformer blocks (Llama ``model.layers.N``, GPT-2 ``transformer.h.N``)."""
    return [name for name, m in model.named_modules()
            if linear_like(m) is not None and (".layers." in f".{name}" or ".h." in f".{name}")]


def layer_sizes(model: nn.Module) -> dict[str, int]:
    """Parameters of every linear-like and embedding module, by name (what "compressible" is summed from)."""
    kinds = (nn.Embedding, LowRankLinear, LowRankEmbedding)
    return {name: parameters(m) for name, m in model.named_modules() if isinstance(m, kinds) or linear_like(m) is not None}


def _shape(module: nn.Module) -> tuple[int, int, int]:
    """(rows, columns, bias entries) of a linear-like module or an embedding table."""
    if isinstance(module, nn.Embedding):
        return module.num_embeddings, module.embedding_dim, 0
    fan_in, fan_out = linear_like(module)
    return fan_in, fan_out, fan_out if getattr(module, "bias", None) is not None else 0


def _cost(shape: tuple[int, int, int], rank: int) -> int:
    rows, cols, bias = shape
    return min(rank * (rows + cols), rows * cols) + bias  # a factorisation no smaller than the layer stays dense


def stored_in_out(layer: nn.Module) -> bool:
    """Whether ``layer.weight`` is stored ``(in, out)``, rows by inputs (a token table's ids, a ``Conv1D``'s features),
    not as ``nn.Linear``'s ``(out, in)``."""
    return isinstance(layer, nn.Embedding) or type(layer).__name__ == "Conv1D"


@torch.no_grad()
def svd_factors_(model: nn.Module, ranks: dict[str, int]) -> None:
    """Replace each layer of ``ranks`` by its truncated SVD as plain factors (``U√S``, ``√S·Vᵀ``) of that rank: the
    plain path a user writes to compress a trained model (``benchmarks/quality/compress.py``)."""
    for name, rank in ranks.items():
        old = model.get_submodule(name)
        rows, cols, bias = _shape(old)
        weight = old.weight.detach().float()
        weight = weight if stored_in_out(old) else weight.T  # (rows, cols)
        left, singular, right = torch.linalg.svd(weight, full_matrices=False)
        root = singular[:rank].sqrt()
        a, b = left[:, :rank] * root, root[:, None] * right[:rank]
        if isinstance(old, nn.Embedding):
            new: nn.Module = LowRankEmbedding(rows, cols, rank, 1.0)
            new.a.copy_(a), new.b.copy_(b)
        else:
            new = LowRankLinear(rows, cols, rank, bias > 0, 1.0)
            new.u.copy_(a), new.v.copy_(b)
            if bias:
                new.bias.copy_(old.bias)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new.to(old.weight.device))


def svd_ranks_of(model: nn.Module) -> dict[str, int]:
    """Each tensorized layer of ``model``: the rank of plain factors holding the parameters its cores hold now."""
    return {name: max(1, round(cores / sides)) for name, (cores, sides) in _tt_sizes(model).items()}


def uniform_ranks_of(model: nn.Module) -> dict[str, int]:
    """One rank for every tensorized layer of ``model``, the plain factors of them all holding about the parameters
    their cores hold now: SVD + fine-tuning as a user writes it by hand, at CoMERA's total size."""
    sizes = _tt_sizes(model)
    rank = max(1, round(sum(cores for cores, _ in sizes.values()) / max(1, sum(sides for _, sides in sizes.values()))))
    return dict.fromkeys(sizes, rank)


def _tt_sizes(model: nn.Module) -> dict[str, tuple[int, int]]:
    """Each tensorized layer's (parameters in its cores, rows + columns of the weight it stands for)."""
    from comera_lightning.rank import tt_layers

    sizes = {}
    for name, layer in tt_layers(model):
        rows, cols = (layer.num_embeddings, layer.embedding_dim) if hasattr(layer, "num_embeddings") else (
            layer.in_features, layer.out_features)
        sizes[name] = (sum(core.numel() for core in layer.cores), rows + cols)
    return sizes


def low_rank_(model: nn.Module, names: list[str], budget: int) -> int:
    """Replace ``names`` by rank-r factorisations, one r for all, the largest whose parameters fit ``budget``.

    A layer whose factorisation would not be smaller than its dense weight stays dense. Returns r.
    """
    shapes = {name: _shape(model.get_submodule(name)) for name in names}
    largest = max((min(rows, cols) for rows, cols, _ in shapes.values()), default=1)
    rank = max([r for r in range(1, largest + 1) if sum(_cost(s, r) for s in shapes.values()) <= budget], default=1)
    for name, (rows, cols, bias) in shapes.items():
        if rank * (rows + cols) >= rows * cols:
            continue
        old = model.get_submodule(name)
        std = float(old.weight.detach().float().std())
        if isinstance(old, nn.Embedding):
            new: nn.Module = LowRankEmbedding(rows, cols, rank, std)
        else:
            new = LowRankLinear(rows, cols, rank, bias > 0, std)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
    return rank
