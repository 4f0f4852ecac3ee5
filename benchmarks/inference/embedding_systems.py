"""The systems ``embedding_speed.py`` compares, their DLRMs, training set-ups and sizes.

* ``dense``: TorchRec's ``EmbeddingBagCollection`` (for training: ``FusedEmbeddingBagCollection``,
  fbgemm's CPU kernels with the Adagrad update fused into the backward, ``EXACT_ADAGRAD``);
* ``int8``: TorchRec's quantised collection, ``torchrec.quant.embedding_modules.EmbeddingBagCollection.from_float``
  with TorchRec's own int8 qconfig (``PlaceholderObserver`` float activations, ``qint8`` weights:
  fbgemm's row-wise int8 tables with an fp16 scale and bias per row); inference only;
* ``tt_before``: ``TTEmbeddingBagCollection.from_ebc(meta, max_rank=32, init="random",
  cache_rows=0, lookup="tables")``: the lookup before the hot-row cache (half tables only);
* ``tt``: the same with the defaults (hot-row cache of automatic size, cost-based lookup);
* ``tt_pruned``: ``tt`` after a simulated late stage (a third of every bond kept, then ``prune_``,
  as ``inference/systems.py`` does): the model a CoMERA run serves; inference only.

Every collection sits in ``torchrec.models.dlrm.DLRM`` (dense arch num_dense-512-256-dim, over
arch 512-256-1, as in ``benchmarks/training/dlrm_systems.py``), MLPs seeded alike.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

SYSTEMS = ("dense", "int8", "tt_before", "tt", "tt_pruned")
TRAIN_SYSTEMS = ("dense", "tt_before", "tt")
TT_OPTIONS = {"tt_before": {"cache_rows": 0, "lookup": "tables"}, "tt": {}, "tt_pruned": {}}
KEEP_FRACTION = 1 / 3
DENSE_ARCH = (512, 256)
OVER_ARCH = (512, 256, 1)


def build_dlrm(collection: Any, dim: int, num_dense: int, seed: int = 0) -> Any:
    """TorchRec's DLRM around ``collection``, its MLPs initialised from ``seed`` (the same for every system)."""
    import torch
    from torchrec.models.dlrm import DLRM

    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return DLRM(embedding_bag_collection=collection, dense_in_features=num_dense,
                    dense_arch_layer_sizes=[*DENSE_ARCH, dim], over_arch_layer_sizes=list(OVER_ARCH))
    finally:
        torch.random.set_rng_state(state)


def int8_collection(dense: Any) -> Any:
    """TorchRec's int8 collection of ``dense``, built as TorchRec's own tests build it (``from_float`` + qconfig)."""
    import torch
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEmbeddingBagCollection

    dense.qconfig = torch.ao.quantization.QConfig(
        activation=torch.ao.quantization.PlaceholderObserver.with_args(dtype=torch.float),
        weight=torch.ao.quantization.PlaceholderObserver.with_args(dtype=torch.qint8),
    )
    try:
        return QuantEmbeddingBagCollection.from_float(dense)
    finally:
        del dense.qconfig


def tt_collection(system: str, configs: list[Any], max_rank: int, min_rows: int) -> Any:
    """The TT collection of ``system``, from a meta collection, random cores (``tt_pruned``: then pruned)."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from benchmarks.training.transformer_systems import keep_ranks_
    from comera_lightning import TTEmbeddingBagCollection
    from comera_lightning.rank import prune_

    meta = EmbeddingBagCollection(tables=configs, device="meta")
    collection = TTEmbeddingBagCollection.from_ebc(meta, max_rank=max_rank, init="random", min_rows=min_rows, **TT_OPTIONS[system])
    if system == "tt_pruned":
        keep_ranks_(collection, KEEP_FRACTION)
        prune_(collection)
    return collection


def build_inference(workload: Any, args: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """Eval-mode DLRMs of every system that builds, and the reason for each that does not."""
    import torch
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    torch.manual_seed(args.seed)
    dense = EmbeddingBagCollection(tables=workload.configs(args.dim))
    collections: dict[str, Any] = {"dense": dense}
    missing: dict[str, str] = {}
    try:
        collections["int8"] = int8_collection(dense)
    except Exception as error:  # reported in the results instead of the row
        missing["int8"] = f"{type(error).__name__}: {error}"
    for system in ("tt_before", "tt", "tt_pruned"):
        collections[system] = tt_collection(system, workload.configs(args.dim), args.max_rank, args.min_rows)
    models = {name: build_dlrm(c, args.dim, workload.num_dense, args.seed).eval() for name, c in collections.items()}
    return models, missing


def count_ids(collection: Any, batches: list[Any]) -> str:
    """Give a TT collection its id frequencies from training batches; how it was done."""
    for batch in batches:
        collection.count_ids(batch.sparse)
    return "count_ids"


def collection_of(model: Any) -> Any:
    return model.sparse_arch.embedding_bag_collection


def tensor_bytes(module: Any) -> int:
    """Bytes of a module's parameters and buffers (each tensor once)."""
    import itertools

    seen: dict[int, int] = {}
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        seen[id(tensor)] = tensor.numel() * tensor.element_size()
    return sum(seen.values())


def serving_bytes(collection: Any) -> tuple[int, str]:
    """Bytes a collection holds for serving: ``inference_bytes()`` where it has one, else parameters + buffers."""
    if hasattr(collection, "inference_bytes"):
        return int(collection.inference_bytes()), "inference_bytes()"
    return tensor_bytes(collection), "parameters+buffers"


def state_dict_bytes(model: Any) -> int:
    """Size on disk of ``torch.save(model.state_dict())`` (written to a temporary file, then removed)."""
    import torch

    with tempfile.TemporaryDirectory(prefix="comera_emb_") as folder:
        path = os.path.join(folder, "state_dict.pt")
        torch.save(model.state_dict(), path)
        return os.path.getsize(path)


def export_bytes(model: Any, example: Any) -> int:
    """Size on disk of the DLRM exported through ``comera_lightning.export`` (dense-tensor entry point, ``prefer="speed"``:
    small tables dense, hot rows, as docs/INFERENCE_EMBEDDINGS.md's figures were measured, with the large tables' cores then, their
    half tables since; ``export_prefer.py`` compares "size")."""
    from comera_lightning import export
    from comera_lightning.export.dlrm import feature_names, kjt_to_ids

    ids = kjt_to_ids(example.sparse, feature_names(model))
    with tempfile.TemporaryDirectory(prefix="comera_emb_") as folder:
        path = Path(folder) / "dlrm.pt2"
        export(model, (example.dense, ids), path, prefer="speed", overwrite=True)
        return path.stat().st_size


def build_training(workload: Any, args: Any) -> dict[str, tuple[Any, Any]]:
    """Train-mode DLRM and optimizer of each training system: dense fbgemm-fused Adagrad + torch fused Adagrad MLPs; TT torch fused Adagrad."""
    import torch
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    torch.manual_seed(args.seed)
    systems: dict[str, tuple[Any, Any]] = {}
    for system in TRAIN_SYSTEMS:
        if system == "dense":
            collection = FusedEmbeddingBagCollection(workload.configs(args.dim), optimizer_type=torch.optim.Adagrad,
                                                     optimizer_kwargs={"lr": args.lr}, device=torch.device("cpu"))
        else:
            collection = tt_collection(system, workload.configs(args.dim), args.max_rank, args.min_rows)
        model = build_dlrm(collection, args.dim, workload.num_dense, args.seed).train()
        fused = system == "dense"  # fbgemm updates the tables inside the backward: the torch optimizer takes the MLPs
        params = [p for n, p in model.named_parameters() if not (fused and "embedding_bag_collection" in n)]
        systems[system] = (model, torch.optim.Adagrad(params, lr=args.lr, fused=True))  # fused: 3x faster on CPU
    return systems
