"""Two-process CPU DDP (gloo) of a workload config through the CLI: fit (with prunes), last.ckpt, test.

Usage: python ddp_cli_script.py <config.yaml> <out-dir> [CLI overrides...]. Lightning starts the
second process by running this script again; each rank writes <out>/rank<N>.pt.
"""

import csv
import sys
from pathlib import Path

import torch

from comera_lightning import ComeraCallback
from comera_lightning.cli.app import ComeraCLI
from comera_lightning.rank import tt_layers

if __name__ == "__main__":
    config, out, overrides = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    cli = ComeraCLI(args=[
        "fit", "--config", config, *overrides, "--trainer.default_root_dir", str(out),
        "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp",
    ])
    test = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, ComeraCallback))
    record = {
        "ranks": {name: list(layer.physical_ranks) for name, layer in tt_layers(cli.model)},
        "state": {k: v.detach().cpu() for k, v in cli.model.state_dict().items()},
        "schedule": callback.schedule.state_dict(), "l0": callback.loss_target_value, "objective": callback.stage_objective.state_dict(),
        "test": test, "last": [str(p) for p in out.rglob("last.ckpt")], "step": cli.trainer.global_step,
        "params_tt": [float(row["comera/params_tt"]) for metrics in out.rglob("metrics.csv")
                      for row in csv.DictReader(open(metrics)) if row.get("comera/params_tt")],
    }
    torch.save(record, out / f"rank{cli.trainer.global_rank}.pt")
