"""What ``optimizer_memory.py`` measures on: the paper-sized encoder (plain ``nn.Linear``), its layout, the optimizers."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from comera_lightning.optim import CAME

#: The paper's layout (six-core trains, attention included), not the package's defaults: docs/METHOD.md §1.1.
PAPER_LAYOUT = {"max_rank": 30, "num_cores": 3, "embedding_num_cores": 4, "include_attention": True, "include_embeddings": True,
                "include_heads": False, "min_compression": 2.0}


class EncoderBlock(nn.Module):
    """Post-LN Transformer encoder block from plain ``nn.Linear`` (so tensorize can swap them)."""

    def __init__(self, d_model: int = 768, d_ff: int = 3072, heads: int = 12) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value, self.out = (nn.Linear(d_model, d_model) for _ in range(4))
        self.ff1, self.ff2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Self-attention then feed-forward, each followed by residual and LayerNorm."""
        b, t, d = x.shape
        q, k, v = (lin(x).view(b, t, self.heads, -1).transpose(1, 2) for lin in (self.query, self.key, self.value))
        att = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = self.norm1(x + self.out(att))
        return self.norm2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


class Encoder(nn.Module):
    """The paper's 6-encoder model body: token + position embeddings, 6 blocks, a 3-way head."""

    def __init__(self, vocab: int = 30522, d_model: int = 768, layers: int = 6, max_len: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(max_len, d_model))
        self.blocks = nn.ModuleList(EncoderBlock(d_model) for _ in range(layers))
        self.classifier = nn.Linear(d_model, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits from the first token."""
        x = self.embed(ids) + self.position[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.classifier(x[:, 0])

OPTIMIZERS: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-4),
    "AdamW(foreach)": lambda p: torch.optim.AdamW(p, lr=1e-4, foreach=True),
    "Adafactor": lambda p: torch.optim.Adafactor(p, lr=1e-2),
    "CAME(loop)": lambda p: CAME(p, lr=1e-4, foreach=False),
    "CAME(foreach)": lambda p: CAME(p, lr=1e-4, foreach=True),
    "CAME(min_factor_size=2**17)": lambda p: CAME(p, lr=1e-4, min_factor_size=1 << 17),
    "CAME(unfolding)": lambda p: CAME(p, lr=1e-4, factor_core_unfolding=True),
}
#: Section (c)'s optimizers, each at its default settings (torch's AdamW picks its own foreach).
PEAK_OPTIMIZERS: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "AdamW": OPTIMIZERS["AdamW"],
    "Adafactor": OPTIMIZERS["Adafactor"],
    "CAME": lambda p: CAME(p, lr=1e-4),
}
