"""Which modules of a model are attention blocks (their projections stay dense unless ``include_attention``).

Found by what a module is, not by one library's names: an ``nn.MultiheadAttention``, a module
whose class is named like an attention (Hugging Face ``LlamaAttention``, ``BertAttention``,
litgpt ``CausalSelfAttention``, T5 ``T5Attention``), or one named like one (``attn``, ``self_attn``).
"""

from __future__ import annotations

from torch import nn

__all__ = ["ATTENTION_NAMES", "attention_blocks"]

ATTENTION_NAMES = frozenset({"attn", "attention", "self_attn", "self_attention", "selfattention", "cross_attn",
                             "crossattention", "encdecattention", "encoder_attn"})


def attention_blocks(model: nn.Module) -> list[str]:
    """Names of the outermost attention modules of ``model`` (the model itself never counts)."""
    blocks: list[str] = []
    for name, module in model.named_modules():
        if not name or any(name.startswith(block + ".") for block in blocks):
            continue
        leaf = name.rsplit(".", 1)[-1].lower()
        if isinstance(module, nn.MultiheadAttention) or "attention" in type(module).__name__.lower() or leaf in ATTENTION_NAMES:
            blocks.append(name)
    return blocks
