"""Scale-out with TorchRec: ``TorchRecDMPStrategy`` (registered as ``"torchrec_dmp"``) and the pieces it uses."""

from comera_lightning.distributed.dmp_strategy import FUSED_OPTIMIZER_KEY, TorchRecDMPStrategy
from comera_lightning.distributed.shardable_collection import ShardableEmbeddingBagCollection, make_shardable
from comera_lightning.distributed.sharded_state import copy_into_shards, gather_sharded

__all__ = [
    "FUSED_OPTIMIZER_KEY", "ShardableEmbeddingBagCollection", "TorchRecDMPStrategy", "copy_into_shards",
    "gather_sharded", "make_shardable",
]
