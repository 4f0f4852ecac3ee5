"""Which linear layers of a model are its output heads (dense unless named in ``target_modules``, or ``include_heads`` and ``widens``).

A head is found by what it is, never by where it was registered (litgpt registers ``lm_head`` before its
blocks): a name like ``lm_head``/``classifier``; a map, outside the model's blocks, from its width back to a
token embedding's vocabulary (a position table's rows are not one); a map to the model's class count
(``num_classes``/``num_labels`` of the model or its ``config``). Only when none of these finds one is a head
inferred from the structure: the linear layers outside the model's blocks (layer stacks, attention blocks:
``repeated_blocks``) whose output no other linear layer takes as input; the last of those.
"""

from __future__ import annotations

from torch import nn

from comera_lightning.tensorize.attention import attention_blocks

__all__ = ["HEAD_NAMES", "output_heads", "repeated_blocks", "widens"]

HEAD_NAMES = frozenset({"classifier", "lm_head", "head", "output_layer", "score", "fc_out", "logits", "predictions", "out_head"})
#: Attributes of a model (or of its ``config``) that give its class count.
CLASS_COUNT_NAMES = ("num_classes", "num_labels", "n_classes")
#: Words in an embedding's name that mark a position table (``_is_position_table``).
POSITION_WORDS = frozenset({"pos", "position", "positions", "positional", "wpe"})


def output_heads(model: nn.Module, linears: list[tuple[str, nn.Module]]) -> dict[str, str]:
    """The output heads among ``linears`` (name -> why), from what the modules are (module docstring)."""
    heads = {n: "named like an output head" for n, _ in linears if n.rsplit(".", 1)[-1] in HEAD_NAMES}
    blocks = repeated_blocks(model)
    outside = [(n, m) for n, m in linears if not any(n.startswith(block) for block in blocks)]
    vocabularies = {(m.embedding_dim, m.num_embeddings) for n, m in model.named_modules()
                    if isinstance(m, nn.Embedding) and not _is_position_table(n)}
    for n, m in outside:  # a block's layers are never heads (repeated_blocks)
        if (m.in_features, m.out_features) in vocabularies and n not in heads:
            heads[n] = f"maps width {m.in_features} to an embedding's vocabulary of {m.out_features}"
    counts = _class_counts(model)
    for n, m in outside:
        if m.out_features in counts and n not in heads:
            heads[n] = f"maps to the model's {m.out_features} classes ({counts[m.out_features]})"
    if not heads and len(linears) > 1 and outside:
        taken = {m.in_features for _, m in linears}
        ends = [n for n, m in outside if m.out_features not in taken] or [n for n, _ in outside]
        heads[ends[-1]] = ("the last nn.Linear outside the model's repeated blocks whose output no other linear layer takes "
                           "(no layer is named like a head or maps to a vocabulary or class count)")
    return heads


def widens(module: nn.Module) -> bool:
    """True for a linear map with more outputs than inputs (a vocabulary head; ``nn.Linear`` or Hugging Face ``Conv1D``)."""
    inputs, outputs = getattr(module, "in_features", None), getattr(module, "out_features", None)
    if inputs is None or outputs is None:
        inputs, outputs = getattr(module, "nx", None), getattr(module, "nf", None)
    return inputs is not None and outputs is not None and outputs > inputs


def repeated_blocks(model: nn.Module) -> list[str]:
    """Name prefixes of the model's blocks, whose linear layers are never heads: attention blocks (``attention.py``),
    modules holding an ``nn.MultiheadAttention``, the entries of a ``ModuleList`` that have children (layer stacks,
    one layer deep or more) and those of a ``Sequential`` holding several modules of one class with children."""
    prefixes = [f"{n}." for n in attention_blocks(model)]
    prefixes += [f"{n}." for n, m in model.named_modules() if any(isinstance(c, nn.MultiheadAttention) for c in m.children())]
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        kinds = [type(c) for c in module.children() if any(True for _ in c.children())]
        for child_name, child in module.named_children():
            if type(child) in kinds and (isinstance(module, nn.ModuleList) or kinds.count(type(child)) > 1):
                prefixes.append(f"{name}.{child_name}." if name else f"{child_name}.")
    return prefixes


def _is_position_table(name: str) -> bool:
    """An embedding named for positions (``position_embeddings``, ``wpe``, ``embed_positions``): no vocabulary."""
    return bool(set(name.rsplit(".", 1)[-1].lower().split("_")) & POSITION_WORDS)


def _class_counts(model: nn.Module) -> dict[int, str]:
    """Class counts the model declares: value -> where it was found."""
    found: dict[int, str] = {}
    for owner, prefix in ((model, ""), (getattr(model, "config", None), "config."), (getattr(model, "hparams", None), "hparams.")):
        for name in CLASS_COUNT_NAMES:
            value = getattr(owner, name, None) if owner is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                found.setdefault(value, prefix + name)
    return found
