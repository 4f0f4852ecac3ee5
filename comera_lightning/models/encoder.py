"""A BERT-style post-LN Transformer encoder built only from ``nn.Linear`` / ``nn.Embedding``.

Every projection is its own ``nn.Linear`` (no fused QKV, no ``nn.MultiheadAttention``) so that
``tensorize`` can swap each one for a ``TTLinear`` by name. Module names inside one layer::

    layers.{i}.attention.{query,key,value,output}   768x768 each
    layers.{i}.attention_norm                        LayerNorm after the attention residual
    layers.{i}.ffn.{intermediate,output}             768->3072, 3072->768
    layers.{i}.ffn_norm                              LayerNorm after the FFN residual
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from comera_lightning.models.dropout import Dropout, dropout

__all__ = [
    "EncoderConfig",
    "Embeddings",
    "SelfAttention",
    "FeedForward",
    "EncoderLayer",
    "Encoder",
    "TransformerEncoderModel",
    "init_bert_weights",
]


@dataclass
class EncoderConfig:
    """Sizes of a BERT-style encoder (defaults: the paper's 6-layer, 768-wide model, docs/METHOD.md §2)."""

    vocab_size: int = 30522
    d_model: int = 768
    num_layers: int = 6
    num_heads: int = 12
    d_ff: int = 3072
    dropout: float = 0.1
    max_positions: int = 512
    type_vocab_size: int = 2
    pad_token_id: int = 0
    layer_norm_eps: float = 1e-12

    def __post_init__(self) -> None:
        """Reject sizes that cannot build a model."""
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_positions", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"EncoderConfig.{name} must be a positive int, got {value!r}.")
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads}); "
                "choose num_heads among the divisors of d_model."
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}.")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id must be in [0, vocab_size={self.vocab_size}), got {self.pad_token_id!r}.")


def init_bert_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT initialisation for one module: N(0, std) weights, zero biases, LayerNorm (1, 0), zero padding row."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class Embeddings(nn.Module):
    """Word + learned position + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_positions, config.d_model)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.d_model)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.dropout)
        self.max_positions = config.max_positions
        self.register_buffer("position_ids", torch.arange(config.max_positions), persistent=False)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """Embed ``input_ids`` of shape ``(batch, seq)`` into ``(batch, seq, d_model)``."""
        seq_len = input_ids.shape[1]
        if seq_len > self.max_positions:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_positions={self.max_positions}; "
                "truncate the inputs or build the model with a larger max_positions."
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(self.position_ids[:seq_len])
            + self.token_type_embeddings(token_type_ids)
        )
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate query/key/value/output projections and SDPA."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        d = config.d_model
        self.num_heads = config.num_heads
        self.head_dim = d // config.num_heads
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.output = nn.Linear(d, d)
        self.dropout_p = config.dropout

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        """Attend over ``x`` ``(batch, seq, d)``; ``attn_mask`` is boolean, broadcastable to ``(batch, heads, seq, seq)``, True = keep."""
        batch, seq, d = x.shape
        q, k, v = self._split_heads(self.query(x)), self._split_heads(self.key(x)), self._split_heads(self.value(x))
        if self.training and self.dropout_p > 0.0 and x.device.type == "cpu":
            ctx = self._attend_with_cpu_dropout(q, k, v, attn_mask)
        else:
            ctx = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=self.dropout_p if self.training else 0.0
            )
        return self.output(ctx.transpose(1, 2).reshape(batch, seq, d))

    def _attend_with_cpu_dropout(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None) -> Tensor:
        """SDPA's math path with the cheaper CPU dropout mask on the attention probabilities.

        On CPU, SDPA with ``dropout_p > 0`` runs this same math path but draws a float
        ``bernoulli_`` mask over all ``batch · heads · seq²`` probabilities.
        """
        scores = (q * self.head_dim**-0.5) @ k.transpose(-2, -1)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        return dropout(scores.softmax(dim=-1), self.dropout_p) @ v


class FeedForward(nn.Module):
    """Position-wise feed-forward block: ``intermediate`` (d -> d_ff), GELU, ``output`` (d_ff -> d)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.intermediate = nn.Linear(config.d_model, config.d_ff)
        self.output = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the FFN to ``(..., d_model)``."""
        return self.output(F.gelu(self.intermediate(x)))


class EncoderLayer(nn.Module):
    """Post-LN encoder layer: ``x = LN(x + Drop(Attn(x)))``; ``x = LN(x + Drop(FFN(x)))``."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        """Transform ``(batch, seq, d_model)`` hidden states."""
        x = self.attention_norm(x + self.dropout(self.attention(x, attn_mask)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


class Encoder(nn.Module):
    """A stack of ``num_layers`` post-LN encoder layers sharing one key-padding mask."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_layers))

    def forward(self, x: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Run the stack; ``attention_mask`` is ``(batch, seq)`` with 1/True for real tokens, 0/False for padding."""
        attn_mask = None
        if attention_mask is not None:
            # (batch, 1, 1, seq): every query may attend only to non-padded keys.
            attn_mask = attention_mask.to(torch.bool)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, attn_mask)
        return x


class TransformerEncoderModel(nn.Module):
    """Embeddings + encoder stack (no head); returns the last hidden states ``(batch, seq, d_model)``."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.apply(init_bert_weights)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Encode token ids ``(batch, seq)``; padded positions (mask 0) are never attended to."""
        return self.encoder(self.embeddings(input_ids, token_type_ids), attention_mask)
