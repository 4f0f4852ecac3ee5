"""Which linear layers of a model are its output heads (left dense unless named in ``target_modules``).

A head is found by what it is: a name like ``lm_head``/``classifier``, or a map from the model's
width back to an embedding's vocabulary. Only when neither finds one is the model's last
``nn.Linear`` outside its attention blocks taken for the head.
"""

from __future__ import annotations

from torch import nn

__all__ = ["HEAD_NAMES", "output_heads"]

HEAD_NAMES = frozenset({"classifier", "lm_head", "head", "output_layer", "score", "fc_out", "logits", "predictions", "out_head"})


def output_heads(model: nn.Module, linears: list[tuple[str, nn.Module]]) -> dict[str, str]:
    """The output heads, from what the modules are: a head's name, or a map back to an embedding's vocabulary.

    Only when neither finds one is the model's last registered ``nn.Linear`` taken for the head (registration
    order says little: litgpt registers ``lm_head`` before its blocks).
    """
    heads = {n: "named like an output head" for n, _ in linears if n.rsplit(".", 1)[-1] in HEAD_NAMES}
    vocabularies = {(m.embedding_dim, m.num_embeddings) for m in model.modules() if isinstance(m, nn.Embedding)}
    for n, m in linears:
        if (m.in_features, m.out_features) in vocabularies and n not in heads:
            heads[n] = f"maps width {m.in_features} to an embedding's vocabulary of {m.out_features}"
    outside_blocks = [n for n, _ in linears if not any(n.startswith(block) for block in attention_blocks(model))]
    if not heads and len(linears) > 1 and outside_blocks:
        heads[outside_blocks[-1]] = "the model's last nn.Linear outside its attention blocks (no layer is named like a head or maps to a vocabulary)"
    return heads


def attention_blocks(model: nn.Module) -> list[str]:
    """Name prefixes of the modules holding an ``nn.MultiheadAttention`` (transformer layers: their linears are no head)."""
    return [f"{n}." for n, m in model.named_modules() if any(isinstance(c, nn.MultiheadAttention) for c in m.children())]
