r"""Compressing a trained DLRM's embedding tables (MovieLens-100K clicks): CoMERA against the plain paths (issue #52).

The package's ``DLRMClassifier`` (TorchRec's DLRM) as ``configs/dlrm_tiny.yaml`` trains it — embedding dim 16
(``--embedding-dim``: 64 is a Criteo DLRM's width), AdamW 1e-3, weight decay 1.0 on tables and MLPs, none on TT
cores, batch 256, a seeded random 80/10/10 split of the ratings (click = rating ≥ 4) — trained dense ``--epochs``;
then, from those weights, each system trains ``--extra`` times the dense steps more, in one process, same data and
seed. The tables compressed are those of at least ``MIN_ROWS`` rows (users, items, zip codes: 2,975 of the 3,028 rows):

* ``comera``: ``ComeraCallback(tensorize=TensorizeConfig(init="svd", target_modules=[the collection]),
  budget=BudgetConfig(compression=C))`` (``--callback key=value``: further ComeraCallback arguments);
* ``svd_ft``: each of those tables replaced by its truncated SVD as two plain factors (``E ≈ A·B``) holding the
  parameters CoMERA's TT table ended with (rank ≥ 1: at high compression a 16-wide table cannot get that small, and
  its real size is reported), fine-tuned the extra steps;
* ``svd_ft_uniform``: the same with one rank for every one of those tables, their factors holding about CoMERA's
  parameters in them (the plain path as a user writes it by hand);
* ``svd_ft_distill``: that with the teacher CoMERA was given (``--callback 'distill={...}'``, required);
* ``prune_ft``: ``torch.nn.utils.prune`` global magnitude pruning of the same tables to CoMERA's count, fine-tuned
  with the masks;
* ``small``: a dense DLRM whose embedding dim gives those tables about CoMERA's size (at least 1), trained from
  scratch for all the steps;
* ``dense_ft`` (once): the dense model trained the extra steps.

Reported: test AUC and log loss of the final weights, and the compressed tables' parameters (nonzeros when pruned).

    python -m benchmarks.quality.compress_dlrm [--compressions 4,8,32] [--epochs 5] [--extra 0.25] [--out PATH]
    python -m benchmarks.quality.compress_dlrm --embedding-dim 64 --epochs 3 --compressions 4,8,32,64   # wide tables
    python -m benchmarks.quality.compress_dlrm --check     # a few batches: the pipeline runs
    python -m benchmarks.quality.compress_dlrm --no-served    # skip exporting each model (default: file bytes, batch-1/32 ms)
"""

from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import json
import sys
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.probes import machine_basics
from benchmarks.quality.baselines import distilled_, magnitude_prune_, nonzero_parameters
from benchmarks.quality.compress_common import (
    markdown,
    quiet_fit,
    recorded_command,
    run_systems,
)
from benchmarks.quality.models import uniform_ranks_of
from benchmarks.quality.served import served_program, without_masks
from benchmarks.quality.settings import _options, check_teacher, default_systems, systems_of
from benchmarks.quality.weights_cache import (
    add_run_arguments,
    apply_check,
    load_or_train,
)
from comera_lightning import BudgetConfig, ComeraCallback, TensorizeConfig
from comera_lightning.data.movielens import MovieLensClicksDataModule
from comera_lightning.models.dlrm import DLRMClassifier

SYSTEMS = ("comera", "svd_ft", "svd_ft_uniform", "svd_ft_distill", "prune_ft", "small", "dense_ft")
NEEDS = {"svd_ft": ("comera",), "svd_ft_uniform": ("comera",), "svd_ft_distill": ("comera",), "prune_ft": ("comera",), "small": ("comera",)}
CHECK = {"epochs": 1, "limit_batches": 4, "compressions": "8"}
DATA = {"split_mode": "random", "batch_size": 256, "eval_batch_size": 4096}
MODEL = {"embedding_dim": 16, "dense_arch_layer_sizes": [64, 16], "over_arch_layer_sizes": [64, 32, 1],
         "lr_cores": 1e-3, "lr_other": 1e-3, "weight_decay": 1.0, "core_weight_decay": 0.0}
COLLECTION = "model.sparse_arch.embedding_bag_collection"
MIN_ROWS = 300


class LowRankEmbeddingBag(nn.Module):
    """An ``nn.EmbeddingBag`` whose table is ``A·B`` (rank r). The factors are named ``cores`` so the module's optimizer
    treats them as CoMERA's cores (no weight decay: decay on each factor compounds in their product)."""

    def __init__(self, bag: nn.EmbeddingBag, rank: int) -> None:
        super().__init__()
        left, singular, right = torch.linalg.svd(bag.weight.detach().float(), full_matrices=False)
        root = singular[:rank].sqrt()
        self.cores = nn.ParameterList([left[:, :rank] * root, root[:, None] * right[:rank]])
        self.mode, self.include_last_offset = bag.mode, bag.include_last_offset

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        return F.embedding_bag(input, self.cores[0] @ self.cores[1], offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights, include_last_offset=self.include_last_offset)


class FactorRows(nn.Module):
    """A ``LowRankEmbeddingBag``'s rows as an exported DLRM looks them up (``ids -> rows``): its two factors, kept."""

    def __init__(self, bag: LowRankEmbeddingBag) -> None:
        super().__init__()
        self.left, self.right = (nn.Parameter(core.detach().clone(), requires_grad=False) for core in bag.cores)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.left) @ self.right


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=5, help="epochs of the dense training (313 steps each)")
    parser.add_argument("--extra", type=float, default=0.25, help="compress steps, as a fraction of the dense steps")
    parser.add_argument("--compressions", default="4,8,32", help="compressions of the tables, comma-separated")
    parser.add_argument("--systems", default=default_systems(SYSTEMS),
                        help=f"comma-separated, from {','.join(SYSTEMS)} (svd_ft_distill only when named)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--embedding-dim", type=int, default=MODEL["embedding_dim"],
                        help="the DLRM's embedding dim (16: configs/dlrm_tiny.yaml's; DLRMs on Criteo use 64-128)")
    parser.add_argument("--callback", nargs="*", default=[], help="further ComeraCallback arguments, key=value (JSON "
                        "values), e.g. core_step_scale=1")
    parser.add_argument("--tensorize", nargs="*", default=[], help="further TensorizeConfig fields, key=value (JSON values)")
    parser.add_argument("--limit-batches", type=int, default=None, help="batches per epoch and per evaluation (a smoke run)")
    add_run_arguments(parser, "compress_dlrm.json", "a few batches of each run: the pipeline runs")
    args = parser.parse_args(argv)
    if args.embedding_dim < 1:
        parser.error(f"--embedding-dim must be a positive width, got {args.embedding_dim} (16: configs/dlrm_tiny.yaml's)")
    apply_check(args, CHECK, "compress_dlrm")
    systems = systems_of(parser, args.systems, SYSTEMS, NEEDS)
    check_teacher(parser, systems, args.callback, "--callback")
    return args, systems


def model_settings(embedding_dim: int) -> dict[str, Any]:
    """``MODEL`` at another embedding dim (the dense arch's last layer matches it)."""
    return {**MODEL, "embedding_dim": embedding_dim, "dense_arch_layer_sizes": [64, embedding_dim]}


def _model(data: MovieLensClicksDataModule, embedding_dim: int) -> DLRMClassifier:
    shape = model_settings(embedding_dim)
    return DLRMClassifier(table_sizes=data.table_sizes, num_dense=data.num_dense, feature_names=data.feature_names,
                          optimizer=lambda groups: torch.optim.AdamW(groups, lr=MODEL["lr_other"], weight_decay=0.0), **shape)


def compressed_tables(model: DLRMClassifier) -> dict[str, nn.Module]:
    """The tables this benchmark compresses (at least ``MIN_ROWS`` rows), by name, as the model holds them now."""
    collection = model.get_submodule(COLLECTION)
    if hasattr(collection, "tt_tables"):
        return dict(collection.tt_tables())
    return {config.name: collection.embedding_bags[config.name] for config in collection.embedding_bag_configs()
            if config.num_embeddings >= MIN_ROWS}


def table_parameters(model: DLRMClassifier) -> int:
    """Parameters of the compressed tables (nonzeros under a pruning mask)."""
    return sum(nonzero_parameters(table) for table in compressed_tables(model).values())


def fit(system: str, data: MovieLensClicksDataModule, args: argparse.Namespace, steps: int, *,
        state: dict[str, Any] | None = None, transform: Any = None, compression: float | None = None,
        embedding_dim: int | None = None, distill: dict[str, Any] | None = None
        ) -> tuple[dict[str, Any], DLRMClassifier]:
    """One system: a fresh model (``state`` loaded, its copy the teacher with ``distill``, then ``transform``), trained
    ``steps`` (CoMERA when ``compression``), tested; its test AUC and loss, table parameters, and the model. The
    embedding dim is ``--embedding-dim``'s unless given."""
    L.seed_everything(args.seed, verbose=False)
    embedding_dim = embedding_dim or args.embedding_dim
    model = _model(data, embedding_dim)
    if state is not None:
        model.load_state_dict(copy.deepcopy(state))
    if distill is not None:
        distilled_(model, distill)
    if transform is not None:
        transform(model)
    callbacks = []
    if compression is not None:
        tensorize = TensorizeConfig(init="svd", target_modules=[COLLECTION], layer_config={COLLECTION: {"min_rows": MIN_ROWS}},
                                    **_options(args.tensorize))
        callbacks = [ComeraCallback(tensorize=tensorize, budget=BudgetConfig(compression=compression), **_options(args.callback))]
    trainer, seconds = quiet_fit(model, data, steps, callbacks, args.limit_batches)
    tested = trainer.test(model, datamodule=data, verbose=False)[0]
    result = {"system": system, "embedding_dim": embedding_dim, "table_parameters": table_parameters(model),
              "parameters": nonzero_parameters(model), "steps": trainer.global_step,
              "test_auc": round(float(tested["test/auc"]), 4), "test_loss": round(float(tested["test/loss"]), 4),
              "seconds": round(seconds, 1)}
    if args.served and system not in ("dense", "dense_ft"):
        result["served"] = served_dlrm(model, data)
    print(f"  {system:8s} dim {embedding_dim:2d} tables {result['table_parameters']:7,} steps {result['steps']:5d} "
          f"test AUC {result['test_auc']:.4f} loss {result['test_loss']:.4f} ({result['seconds']}s)", file=sys.stderr, flush=True)
    return result, model


def low_rank_(model: DLRMClassifier, sizes: dict[str, int]) -> dict[str, int]:
    """Each compressed table replaced by SVD factors holding about ``sizes[name]`` parameters; returns the ranks."""
    bags = model.get_submodule(COLLECTION).embedding_bags
    ranks = {}
    for name, size in sizes.items():
        rows, cols = bags[name].weight.shape
        ranks[name] = max(1, round(size / (rows + cols)))
        bags[name] = LowRankEmbeddingBag(bags[name], ranks[name])
    return ranks


def compress_at(data: MovieLensClicksDataModule, args: argparse.Namespace, systems: list[str], state: dict[str, Any],
                compression: float, steps: int, extra: int) -> dict[str, dict[str, Any]]:
    """Every system of ``systems`` at one compression of the tables, from the trained ``state``."""
    comera, model = fit("comera", data, args, extra, state=state, compression=compression)
    sizes = {name: sum(core.numel() for core in table.cores) for name, table in compressed_tables(model).items()}
    results = {"comera": {**comera, "sizes": sizes}}
    for system in [s for s in ("svd_ft", "svd_ft_distill") if s in systems]:
        ranks: dict[str, int] = {}
        teacher = _options(args.callback)["distill"] if system == "svd_ft_distill" else None
        results[system], _ = fit(system, data, args, extra, state=state, distill=teacher,
                                 transform=lambda m: ranks.update(low_rank_(m, sizes)))
        results[system]["ranks"] = ranks
    if "svd_ft_uniform" in systems:  # the TT layers are the compressed tables: one rank for them all, as for the LMs
        (rank,) = set(uniform_ranks_of(model).values())
        uniform = {name: rank * (table.num_embeddings + table.embedding_dim) for name, table in compressed_tables(model).items()}
        results["svd_ft_uniform"], _ = fit("svd_ft_uniform", data, args, extra, state=state,
                                           transform=lambda m: low_rank_(m, uniform))
        results["svd_ft_uniform"]["rank"] = rank
    if "prune_ft" in systems:
        names = [f"{COLLECTION}.embedding_bags.{name}" for name in sizes]
        results["prune_ft"], _ = fit("prune_ft", data, args, extra, state=state,
                                     transform=lambda m: magnitude_prune_(m, names, comera["table_parameters"]))
    if "small" in systems:
        rows = sum(size for size in data.table_sizes if size >= MIN_ROWS)  # the compressed tables' rows
        dim = max(1, round(comera["table_parameters"] / rows))
        results["small"], _ = fit("small", data, args, steps + extra, embedding_dim=dim)
    return results


def trained_dense(data: MovieLensClicksDataModule, args: argparse.Namespace, steps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The dense model trained ``steps`` (from the cache when it holds this very run): (weights, result)."""
    settings = json.dumps({"model": model_settings(args.embedding_dim), "data": DATA, "steps": steps,
                           "limit": args.limit_batches}, sort_keys=True)
    key = f"dlrm_s{steps}_seed{args.seed}_{hashlib.sha1(settings.encode()).hexdigest()[:10]}"
    state, result, cached = load_or_train(args.cache / f"{key}.pt", lambda: fit("dense", data, args, steps))
    return state, {**result, "cached": True} if cached else result


def served_dlrm(model: DLRMClassifier, data: MovieLensClicksDataModule) -> dict[str, Any]:
    """``model``'s exported dense entry point: file bytes, batch-1/32 ms on the first test batch's samples (SVD factors
    served as factors, pruned tables with their zeros)."""
    from comera_lightning.export.dlrm import feature_names, kjt_to_ids

    model = without_masks(model)
    bags = model.get_submodule(COLLECTION).embedding_bags
    for name, bag in list(bags.items()):
        if isinstance(bag, LowRankEmbeddingBag):
            bags[name] = FactorRows(bag)
    batch = next(iter(data.test_dataloader()))
    dense, ids = batch.dense[:32], kjt_to_ids(batch.sparse, feature_names(model))[:32]
    return served_program(model, lambda size: (dense[:size], ids[:size]))


def served_dense(state: dict[str, Any], data: MovieLensClicksDataModule, embedding_dim: int) -> dict[str, Any]:
    """``served_dlrm`` of the dense model holding ``state``."""
    model = _model(data, embedding_dim)
    model.load_state_dict(state)
    return served_dlrm(model, data)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, systems = parse_args(argv)
    torch.set_num_threads(1)
    L.seed_everything(args.seed, verbose=False)
    data = MovieLensClicksDataModule(**DATA, seed=args.seed)
    data.prepare_data()
    data.setup("fit")
    per_epoch = len(data.train_dataloader())
    steps = args.epochs * (min(per_epoch, args.limit_batches) if args.limit_batches else per_epoch)
    extra = max(1, round(args.extra * steps))
    out: dict[str, Any] = {
        "benchmark": "compress_dlrm", "command": recorded_command("benchmarks.quality.compress_dlrm", argv),
        "date": datetime.date.today().isoformat(), "machine": machine_basics(),
        "model": model_settings(args.embedding_dim), "data": DATA, "min_rows": MIN_ROWS, "args": {k: v for k, v in vars(args).items() if k not in ("cache", "out")},
        "systems": systems, "dense_steps": steps, "extra_steps": extra}
    return run_systems(out, args, systems, lambda: trained_dense(data, args, steps),
                       lambda system, extra, state: fit(system, data, args, extra, state=state),
                       lambda state, c: compress_at(data, args, systems, state, c, steps, extra), table, "compress_dlrm.json",
                       (lambda state: served_dense(state, data, args.embedding_dim)) if args.served else None)


def _cell(run: dict[str, Any], dense: dict[str, Any]) -> str:
    return (f"{run['test_auc']:.4f} ({run['test_auc'] - dense['test_auc']:+.4f}), {run['test_loss']:.4f}, "
            f"{run['table_parameters']:,}")


def table(out: dict[str, Any]) -> str:
    """Test AUC (against the trained dense model), test loss and the compressed tables' parameters per system and
    compression (markdown), the dense model's above them."""
    dense = out["dense"]
    return markdown(out, SYSTEMS, "DLRM on MovieLens-100K",
                    f"dense trained {out['dense_steps']} steps: test AUC {dense['test_auc']:.4f}, loss "
                    f"{dense['test_loss']:.4f}, compressed tables {dense['table_parameters']:,} parameters", _cell,
                    "Test AUC (against dense), test log loss, the compressed tables' parameters.")


if __name__ == "__main__":
    main()
