"""TorchRec: ``EmbeddingBagCollection`` → :class:`~comera_lightning.layers.TTEmbeddingBagCollection`.

Imported by the registry once the program has imported torchrec.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from comera_lightning.layers.tt_embedding_bag import EmbeddingBagCollection, TTEmbeddingBagCollection
from comera_lightning.tensorize.converters import EBC_OPTIONS, bag_defaults
from comera_lightning.tensorize.registry import Converter, register_converter


def _build_ebc(module: nn.Module, options: dict[str, Any]) -> TTEmbeddingBagCollection:
    return TTEmbeddingBagCollection.from_ebc(module, **options)


register_converter(EmbeddingBagCollection, Converter("ebc", _build_ebc, EBC_OPTIONS, bag_defaults))
