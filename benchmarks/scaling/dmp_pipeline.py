"""TorchRec's ``TrainPipelineSparseDist`` against a plain training loop, for our tensorized DLRM under DMP.

Two gloo processes (spawned here, one torch thread each) build the same DLRM twice: the large
tables tensorized by ``comera_lightning.tensorize`` (TT, replicated), the small ones dense and
sharded table-wise by TorchRec's planner (``make_shardable`` + ``DistributedModelParallel``, as
``TorchRecDMPStrategy`` does), wrapped in TorchRec's ``DLRMTrain`` (``batch -> (loss, output)``).
One copy trains with the plain loop (forward, backward, step), the other through
``TrainPipelineSparseDist.progress``, on the same synthetic Criteo-shaped batches; the variants take
turns, ``--steps`` each per round. Reported: rows/s over both ranks per variant (median and range
over rounds), their ratio, which sharded modules the pipeline rewrote to overlap their input
all-to-all with compute (TorchRec only pipelines a sharded module whose input comes straight from
the batch), and the largest weight difference between the two copies after the same steps on the
same batches (the pipeline reorders work, it should not change it).

    .venv/bin/python -m benchmarks.scaling.dmp_pipeline [--steps 30] [--rounds 3] [--batch 512]
        [--out benchmarks/results/dmp_pipeline.json]

About a minute at the defaults on 2 cores. On CPU there are no CUDA streams to overlap with: the
pipeline's gain is meant for GPUs, where it hides the all-to-all and the host-to-device copy.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.probes import command_line, machine_basics

TABLES = [200_000, 100_000, 50_000, 512, 64]  # >= 1,000 rows (the collection's min_rows): TT; the rest dense, sharded
NUM_DENSE = 13


def build(embedding_dim: int) -> torch.nn.Module:
    """DLRMTrain over our DLRM, TT tables tensorized, dense tables sharded under DMP (a table-wise plan)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DefaultDataParallelWrapper
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.models.dlrm import DLRMTrain

    from comera_lightning import tensorize
    from comera_lightning.distributed import make_shardable
    from comera_lightning.models.dlrm import DLRMClassifier

    torch.manual_seed(0)
    classifier = DLRMClassifier(table_sizes=TABLES, num_dense=NUM_DENSE, embedding_dim=embedding_dim,
                                dense_arch_layer_sizes=[64, embedding_dim], over_arch_layer_sizes=[64, 1])
    tensorize(classifier, target_modules=["model.sparse_arch.embedding_bag_collection"], embedding_max_rank=16,
              embedding_num_cores=3)
    model = DLRMTrain(classifier.model)
    make_shardable(model)
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                          "learning_rate": 0.01})
    dense_tables = [f"t_cat_{i}" for i, rows in enumerate(TABLES) if rows < 1_000]
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, local_world_size=2, compute_device="cpu"),
        constraints={name: ParameterConstraints(sharding_types=["table_wise"]) for name in dense_tables},
    )
    plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    return DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=[sharder],
                                    data_parallel_wrapper=DefaultDataParallelWrapper(static_graph=False))


def optimizer_for(model: torch.nn.Module) -> torch.optim.Optimizer:
    """TorchRec's combined optimizer: the DMP's fused one for the sharded tables, Adam for the rest."""
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                  lambda params: torch.optim.Adam(params, lr=1e-3))
    return CombinedOptimizer([model.fused_optimizer, dense])


def batches(rank: int, count: int, batch: int):
    from comera_lightning.data.criteo.synthetic import SyntheticCriteoDataset

    return list(SyntheticCriteoDataset(num_batches=count, batch_size=batch, table_sizes=TABLES, num_dense=NUM_DENSE,
                                       zipf_exponent=1.05, seed=rank, stream=0, scatter_ids=True))


def plain_steps(model, optimizer, data) -> None:
    for batch in data:
        optimizer.zero_grad()
        loss, _ = model(batch)
        loss.backward()
        optimizer.step()


def worker(rank: int, port: int, args: argparse.Namespace, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=120))
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    plain, piped = build(args.embedding_dim), build(args.embedding_dim)
    plain_opt, piped_opt = optimizer_for(plain), optimizer_for(piped)
    pipeline = TrainPipelineSparseDist(piped, piped_opt, device=torch.device("cpu"))
    data = batches(rank, args.steps, args.batch)

    def run_plain() -> None:
        plain_steps(plain, plain_opt, data)

    def run_pipeline() -> None:
        pipeline.reset() if hasattr(pipeline, "reset") else None
        iterator = iter(data)
        while True:
            try:
                pipeline.progress(iterator)
            except StopIteration:
                break

    variants = {"plain_loop": run_plain, "train_pipeline_sparse_dist": run_pipeline}
    run_plain(), run_pipeline()  # warm-up: first-call set-up, the pipeline's model rewrite
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for round_index in range(args.rounds):
        names = list(variants)[round_index % 2 :] + list(variants)[: round_index % 2]
        for name in names:
            dist.barrier()
            start = time.perf_counter()
            variants[name]()
            elapsed = torch.tensor(time.perf_counter() - start)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slower rank sets the pace
            seconds[name].append(float(elapsed))
    difference = torch.tensor(max_difference(plain, piped))
    dist.all_reduce(difference, op=dist.ReduceOp.MAX)  # each rank holds its own shards: compare them all
    if rank == 0:
        rewritten = [type(m).__name__ for m in getattr(pipeline, "_pipelined_modules", [])]
        out.write_text(json.dumps({"seconds": seconds, "pipelined_modules": rewritten,
                                   "max_weight_difference": float(difference)}))
    # Both ranks tear the group down together: a rank that exits while its peer still works on the group can make
    # gloo abort the peer (a CI run lost rank 1 to SIGABRT once, not reproduced in 36 runs under load).
    dist.barrier()
    dist.destroy_process_group()


def max_difference(first: torch.nn.Module, second: torch.nn.Module) -> float:
    """Largest |difference| between the two models' weights on this rank (its part of the sharded tables included)."""
    from comera_lightning.distributed.sharded_state import is_sharded

    def local(value):  # a table-wise shard lives on one rank: elsewhere an empty tensor
        if not is_sharded(value):
            return value
        shards = value.local_shards()
        return shards[0].tensor if shards else torch.zeros(0)

    other = second.state_dict()
    return max(float((local(v) - local(other[k])).abs().max()) for k, v in first.state_dict().items()
               if local(v).numel() and local(v).is_floating_point())


def free_port() -> int:
    """``$MASTER_PORT`` when set (the tests give each pytest-xdist worker its own), else any free port."""
    if os.environ.get("MASTER_PORT"):
        return int(os.environ["MASTER_PORT"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=512, help="rows per rank and step")
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "rank0.json"
        torch.multiprocessing.spawn(worker, args=(free_port(), args, raw), nprocs=2)
        measured = json.loads(raw.read_text())
    rows = args.steps * args.batch * 2
    rates = {name: [rows / s for s in values] for name, values in measured["seconds"].items()}
    medians = {name: statistics.median(values) for name, values in rates.items()}
    result = {
        "command": command_line(), "machine": machine_basics(), "torch": torch.__version__,
        "tables": TABLES, "batch_per_rank": args.batch, "steps": args.steps, "rounds": args.rounds, "processes": 2,
        "rows_per_s": {name: {"median": round(medians[name]), "range": [round(min(v)), round(max(v))]}
                       for name, v in rates.items()},
        "pipeline_over_plain": round(medians["train_pipeline_sparse_dist"] / medians["plain_loop"], 2),
        "pipelined_modules": measured["pipelined_modules"],
        "max_weight_difference_after_equal_steps": measured["max_weight_difference"],
    }
    print(json.dumps({k: result[k] for k in ("rows_per_s", "pipeline_over_plain", "pipelined_modules",
                                             "max_weight_difference_after_equal_steps")}, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
