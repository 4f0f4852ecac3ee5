"""CUDAGraphStrategy (:mod:`.cuda_graph`) and the plain code it is built on (:mod:`.capture`, :mod:`.graph_cache`,
:mod:`.hyperparams`, :mod:`.step_checks`); the protocols between a strategy and the callback (:mod:`.protocol`)."""

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
from comera_lightning.strategy.hyperparams import GraphedOptimizer, plain_checkpoint
from comera_lightning.strategy.protocol import GraphSignatureSource, ResizeListener
from comera_lightning.strategy.step_checks import NonFiniteFlag, NonFiniteStep, graph_device

__all__ = [
    "CAPTURE", "EAGER", "REPLAY", "WARMUP", "CUDAGraphStrategy", "GraphCache", "GraphSignatureSource", "GraphedOptimizer",
    "NonFiniteFlag", "NonFiniteStep", "ResizeListener", "StepGraph", "UncapturableBatch", "batch_key", "deferring", "graph_device", "make_capturable_",
    "pad_to_bucket", "plain_checkpoint",
]
