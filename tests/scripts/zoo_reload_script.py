"""The compatibility matrix's reload, in a process that never trained: every family saved in a folder, one process.

``python -m tests.scripts.zoo_reload_script FOLDER [--programs]``: for each ``<key>.pt`` (state, inputs, eval logits) the family
is built again from ``tests.helpers.zoo_families``, tensorized as in the matrix, loaded strictly (the TT layers take
the saved, pruned ranks) and run in eval mode; with ``--programs``, ``<key>.pt2`` (the exported program) is
loaded with ``torch.export.load`` and run. Prints one JSON object: key -> the largest differences from the saved logits, or
the error.
"""

import json
import sys
import traceback
from pathlib import Path

import torch

from comera_lightning import tensorize
from tests.helpers.zoo_families import BY_KEY


def _difference(out: torch.Tensor, expected: torch.Tensor) -> float:
    return float((out.reshape(-1) - expected.reshape(-1)).abs().max())


def reload(folder: Path, key: str, programs: bool) -> dict:
    """Rebuild, tensorize, load and run ``key``; with ``programs``, also load and run its exported program."""
    saved = torch.load(folder / f"{key}.pt", weights_only=False)  # the DLRM's inputs hold a KeyedJaggedTensor
    family = BY_KEY[key]
    model = family.build()
    tensorize(model, **family.tensorize_options())
    model.load_state_dict(saved["state"])
    model.eval()
    with torch.no_grad():
        result = {"state": _difference(model(*saved["inputs"]), saved["expected"])}
        if programs:  # torch.export.load takes seconds per program: the slow matrix does it
            program = torch.export.load(folder / f"{key}.pt2").module()
            result["program"] = _difference(program(*saved["program_inputs"]), saved["expected"])
    return result


def main(folder: Path, programs: bool) -> dict:
    """Every family saved in ``folder``: key -> differences, or ``{"error": ...}``."""
    results = {}
    for path in sorted(folder.glob("*.pt")):
        try:
            results[path.stem] = reload(folder, path.stem, programs)
        except Exception:  # one family's failure must not hide the others' results
            results[path.stem] = {"error": traceback.format_exc(limit=-4)}
    return results


if __name__ == "__main__":
    torch.manual_seed(123)  # another seed than the training process: the loaded weights must not depend on it
    print(json.dumps(main(Path(sys.argv[1]), "--programs" in sys.argv[2:])))
