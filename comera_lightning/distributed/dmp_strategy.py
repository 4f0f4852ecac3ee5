"""``TorchRecDMPStrategy``: Lightning's DDP strategy with TorchRec's ``DistributedModelParallel`` as the wrapper.

Dense embedding tables (TorchRec ``EmbeddingBagCollection`` s, and the small tables of a
``TTEmbeddingBagCollection``, moved into one by :func:`make_shardable`) are sharded by TorchRec's
planner and trained by TorchRec's fused optimizer in the backward pass; everything else (the TT
tables, MLPs, gates) is replicated and data parallel (DDP inside DMP), trained by the module's own
optimizer. After a prune the inner DDP is rebuilt, which also broadcasts rank 0's replicated state.
Checkpoints are plain: the sharded tables and their fused-optimizer state are gathered to rank 0 and
copied back into each rank's shards on load, so a DMP checkpoint resumes on any number of processes.
Select it with ``Trainer(strategy="torchrec_dmp")`` (``--trainer.strategy torchrec_dmp``) or build
it with arguments (see docs/SCALING.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from torch import nn

from comera_lightning._optional import require
from comera_lightning.distributed.shardable_collection import make_shardable
from comera_lightning.distributed.sharded_state import copy_into_shards, gather_sharded, is_sharded

_FEATURE = "TorchRecDMPStrategy"
_model_parallel = require("torchrec.distributed.model_parallel", _FEATURE)
_embeddingbag = require("torchrec.distributed.embeddingbag", _FEATURE)
_planner = require("torchrec.distributed.planner", _FEATURE)
_planner_types = require("torchrec.distributed.planner.types", _FEATURE)
_types = require("torchrec.distributed.types", _FEATURE)
EmbOptimType = require("fbgemm_gpu.split_embedding_configs", _FEATURE).EmbOptimType

__all__ = ["TorchRecDMPStrategy", "FUSED_OPTIMIZER_KEY"]

FUSED_OPTIMIZER_KEY = "torchrec_fused_optimizer"
SPARSE_OPTIMIZERS = {"sgd": "EXACT_SGD", "adagrad": "EXACT_ADAGRAD", "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD", "adam": "ADAM"}
SHARDING_TYPES = tuple(t.value for t in _types.ShardingType)


class TorchRecDMPStrategy(DDPStrategy):
    """DDP for the replicated part, TorchRec model parallelism for the dense embedding tables.

    Args:
        sparse_optimizer: TorchRec's fused optimizer for the sharded tables: ``"rowwise_adagrad"``
            (TorchRec's usual choice), ``"adagrad"``, ``"adam"`` or ``"sgd"``.
        sparse_lr: its learning rate; ``sparse_eps`` its epsilon.
        sharding_types: sharding types the planner may use for every table (``"table_wise"``,
            ``"column_wise"``, ...); ``None`` lets the planner choose.
        **kwargs: the arguments of Lightning's ``DDPStrategy`` (``find_unused_parameters``, ...).
    """

    strategy_name = "torchrec_dmp"

    def __init__(
        self,
        sparse_optimizer: str = "rowwise_adagrad",
        sparse_lr: float = 0.01,
        sparse_eps: float = 1e-8,
        sharding_types: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if sparse_optimizer not in SPARSE_OPTIMIZERS:
            raise ValueError(f"sparse_optimizer={sparse_optimizer!r} is not one of {sorted(SPARSE_OPTIMIZERS)}.")
        if not sparse_lr > 0:
            raise ValueError(f"sparse_lr must be positive, got {sparse_lr!r}.")
        unknown = [t for t in sharding_types or [] if t not in SHARDING_TYPES]
        if unknown or sharding_types == []:
            raise ValueError(f"sharding_types {sharding_types!r}: give None or a non-empty list from {SHARDING_TYPES}.")
        self.fused_params = {
            "optimizer": getattr(EmbOptimType, SPARSE_OPTIMIZERS[sparse_optimizer]),
            "learning_rate": float(sparse_lr), "eps": float(sparse_eps),
        }
        self.sharding_types = list(sharding_types) if sharding_types else None
        self.plan = None
        self._fused_state_to_save: dict | None = None

    # ------------------------------------------------------------------ wrapping
    def _setup_model(self, model: nn.Module) -> nn.Module:
        """Move dense tables into shardable collections, plan, shard (keeping their values), DDP the rest."""
        make_shardable(model)
        before = {k: v.detach().clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
        sharder = _embeddingbag.EmbeddingBagCollectionSharder(fused_params=dict(self.fused_params))
        self.plan = self._make_plan(model, sharder)
        dmp = _model_parallel.DistributedModelParallel(
            model, device=self.root_device, plan=self.plan, sharders=[sharder],
            data_parallel_wrapper=self._data_parallel_wrapper(),
        )
        copy_into_shards(model.state_dict(), before)  # DMP re-initialises the tables it shards
        return dmp

    def _make_plan(self, model: nn.Module, sharder: Any) -> Any:
        constraints = None
        if self.sharding_types:
            tables = [c.name for m in model.modules() if type(m) is _embeddingbag.EmbeddingBagCollection
                      for c in m.embedding_bag_configs()]
            constraints = {name: _planner_types.ParameterConstraints(sharding_types=self.sharding_types) for name in tables}
        topology = _planner.Topology(
            world_size=self.world_size, local_world_size=self.num_processes, compute_device=self.root_device.type
        )
        planner = _planner.EmbeddingShardingPlanner(topology=topology, constraints=constraints)
        return planner.collective_plan(model, [sharder], torch.distributed.GroupMember.WORLD)

    def _data_parallel_wrapper(self) -> Any:
        return _model_parallel.DefaultDataParallelWrapper(
            static_graph=False, find_unused_parameters=self._ddp_kwargs.get("find_unused_parameters", False)
        )

    def on_parameters_resized(self) -> None:
        """After a prune: rebuild DDP over the replicated part (new shapes; rank 0's values broadcast)."""
        dmp = self.model
        if not isinstance(dmp, _model_parallel.DistributedModelParallel):
            return
        inner = dmp._dmp_wrapped_module
        if isinstance(inner, torch.nn.parallel.DistributedDataParallel):
            dmp._dmp_wrapped_module = inner.module
        self._data_parallel_wrapper().wrap(dmp, dmp._env, self.root_device)

    @property
    def fused_optimizer(self) -> Any:
        """TorchRec's optimizer of the sharded tables (``None`` before the model is wrapped)."""
        return self.model.fused_optimizer if isinstance(self.model, _model_parallel.DistributedModelParallel) else None

    # ------------------------------------------------------------------ checkpoints
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The module's state with the sharded tables gathered whole (collective: every rank calls it)."""
        state = gather_sharded(self.lightning_module.state_dict())
        fused = self.fused_optimizer
        self._fused_state_to_save = gather_sharded(fused.state_dict()) if fused is not None else None
        return state

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Rank 0 writes one plain file, the sharded tables' fused-optimizer state included."""
        if self._fused_state_to_save is not None:
            checkpoint[FUSED_OPTIMIZER_KEY] = self._fused_state_to_save
            self._fused_state_to_save = None
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Load a plain checkpoint; tables already sharded take this rank's slices of the whole tensors."""
        module = self.lightning_module
        live = module.state_dict()
        if not any(is_sharded(v) for v in live.values()):
            return super().load_model_state_dict(checkpoint, strict)
        copied = set(copy_into_shards(live, checkpoint["state_dict"]))
        rest = {k: v for k, v in checkpoint["state_dict"].items() if k not in copied}
        result = module.load_state_dict(rest, strict=False)
        missing = [k for k in result.missing_keys if k not in copied and not k.startswith(_sharded_keys(live))]
        if strict and (missing or result.unexpected_keys):
            raise RuntimeError(f"checkpoint does not match the model: missing {missing}, unexpected {result.unexpected_keys}.")

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """The module's optimizers as usual, then the fused optimizer's state (if the checkpoint has it)."""
        super().load_optimizer_state_dict(checkpoint)
        fused, saved = self.fused_optimizer, checkpoint.get(FUSED_OPTIMIZER_KEY)
        if fused is not None and saved is not None:
            copy_into_shards(fused.state_dict(), saved)


def _sharded_keys(live: Mapping[str, Any]) -> tuple[str, ...]:
    """Keys of the sharded entries, as prefixes: a sharded module may list them as missing under longer names."""
    return tuple(k for k, v in live.items() if is_sharded(v))


StrategyRegistry.register(
    TorchRecDMPStrategy.strategy_name, TorchRecDMPStrategy,
    description="DDP plus TorchRec DistributedModelParallel for the dense embedding tables (comera_lightning)",
)
