"""CUDAGraphStrategy (:mod:`.cuda_graph`) and the capture machinery it is built on (:mod:`.capture`)."""

from comera_lightning.strategy.capture import (
    CAPTURE,
    EAGER,
    REPLAY,
    WARMUP,
    GraphCache,
    StepGraph,
    UncapturableBatch,
    batch_key,
    deferring,
    make_capturable_,
    pad_to_bucket,
)
from comera_lightning.strategy.cuda_graph import CUDAGraphStrategy

__all__ = [
    "CAPTURE", "EAGER", "REPLAY", "WARMUP", "CUDAGraphStrategy", "GraphCache", "StepGraph", "UncapturableBatch",
    "batch_key", "deferring", "make_capturable_", "pad_to_bucket",
]
