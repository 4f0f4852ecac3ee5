"""The results pages: one per question, each section a table rendered from one file of ``benchmarks/results/``."""

from __future__ import annotations

from benchmarks.report.page_parts import GPU, OURS, RACE, SCALING, Page, Section
from benchmarks.report.pages_compression import COMPRESSION_PAGES

__all__ = ["PAGES", "Page", "Section"]

PAGES = [
    Page("quality", "Quality from scratch", "How good is a model trained with CoMERA from random init, against dense, a "
         "dense model of its size and fixed ranks, at the budget users train for?", [
             Section("A short budget: BPE Llama 128×2, 240 steps", "quality.json", RACE,
                     "`python -m benchmarks.quality`: each system at its best LR of the sweep; narrow is a dense model "
                     "of CoMERA's size, lowrank two plain factors."),
             Section("About 20 tokens per parameter: byte Llama 48×4", "quality_long_llama48.json", RACE),
             Section("About 20 tokens per parameter: BPE GPT-2 48×2", "quality_long_gpt48.json", RACE),
             Section("LLaMA-60M shape on an H200, 300 steps", "h200/recipe_60m_300steps.json", RACE,
                     "The paper recipe's first device run (before the fourth wave's step rule)."),
             Section("Sentence-pair classifier (`make demo`'s Transformer), seed 0", "pairs_frontier.json",
                     "benchmarks.quality.pairs_frontier:markdown"),
             Section("The same, seed 1", "pairs_frontier_seed1.json", "benchmarks.quality.pairs_frontier:markdown"),
             Section("Drop-in on Hugging Face models", "drop_in.json", f"{SCALING}:drop_in",
                     "Random-init BERT, Llama and GPT-2 classifiers (hidden 128, 2 layers), one plain optimizer, the "
                     "callback given only `max_rank=16, early_epochs=3, target_ratio=0.2` (the defaults and the paper's "
                     "late stage of 2026-11-23). A toy task (the class is the first token's id mod 4) that rewards "
                     "memorising ids: it shows that pruning happens under a user's optimizer, not quality."),
         ]),
    *COMPRESSION_PAGES,
    Page("speed_cpu", "Speed on CPU", "How fast is a CoMERA training step on a CPU, and what does it launch?", [
             Section("The paper's Transformer (6 encoders, d_model 768)", "transformer_speed.json",
                     f"{OURS}:transformer_speed",
                     "Interleaved steps in one process (step time) and one process per system (memory); GaLore at "
                     "batch 1 as in the paper."),
             Section("What a step launches: the step account", "step_account.json",
                     "benchmarks.training.step_account:markdown",
                     "Counted on CPU: kernels (non-view aten ops), GEMM FLOPs, bytes saved for backward. How a CPU "
                     "session sees a GPU's cost: [What a step costs a GPU](../STEP_COST.md)."),
             Section("The step account at the LLaMA-350M shape", "step_account_llama350m.json",
                     "benchmarks.training.step_account:markdown"),
             Section("The step account at the LLaMA-1B shape (2 and 4 blocks, extended to 24)",
                     "step_account_llama1b.json", "benchmarks.training.step_account:markdown"),
             Section("The step account in fp32 at batch 2", "step_account_fp32.json",
                     "benchmarks.training.step_account:markdown", "The issue's first way of counting."),
             Section("The step account with ranks in 16-byte rows", "step_account_aligned.json",
                     "benchmarks.training.step_account:markdown",
                     "Ranks derived from fractions round down to a multiple of 8 in layers at least 256 wide "
                     "(`tensorize/build.py`, `aligned_rank`); \"of them misaligned\": GEMM FLOPs a GPU runs on its "
                     "slow kernels ([What a step costs a GPU](../STEP_COST.md#the-cut-made-after-it-ranks-in-16-byte-rows))."),
             Section("The step account, token tables through the whole table", "step_account_whole_table.json",
                     "benchmarks.training.step_account:markdown",
                     "As a GPU looks them up at batch 32 since 2026-11-30 (`kernels/full_table.py`; the accounts above "
                     "counted the torch path a CPU runs): [What a step costs a GPU]"
                     "(../STEP_COST.md#the-next-cut-the-token-tables-lookup-through-the-whole-table)."),
             Section("The same, the code the H200 ran on 2026-11-30", "step_account_unaligned.json",
                     "benchmarks.training.step_account:markdown",
                     "Commit 2694884 (ranks as their fractions gave them), counted with the next commit's counter."),
             Section("The step account before the fifth wave's cuts", "h200/step_account_c7f9c21.json",
                     "benchmarks.training.step_account:markdown",
                     "The code that ran on the H200 on 2026-11-28 (commit c7f9c21), counted the same way."),
             Section("LLaMA-60M's token table by lookup route", "token_lookup_cpu.json",
                     "benchmarks.training.token_lookup:markdown",
                     "Forward and backward of the 32,000 x 512 table (two factors at rank 440) for 8,192 ids, each route "
                     "side by side in one process; the per-id kernel runs on CUDA only (its cost counted by formula). "
                     "On a GPU the layer now takes the whole table here ([What a step costs a GPU]"
                     "(../STEP_COST.md#the-next-cut-the-token-tables-lookup-through-the-whole-table))."),
             Section("One layer at a time", "layer_speed.json", f"{GPU}:layer_speed"),
         ]),
    Page("speed_gpu", "Speed on a GPU", "How fast is a CoMERA step on an H200, measured, and what does the device "
         "model predict for the steps not yet measured?", [
             Section("Measured after the cuts: steps/s, bf16, batch 32 (2026-11-30)", "h200/gpu_speed_2026-11-30.json",
                     "benchmarks.training.gpu_speed:markdown",
                     "`python -m benchmarks.device_session --budget 470`; early stage (every rank alive), ranks not yet "
                     "in 16-byte rows."),
             Section("The same, `torch.compile`", "h200/gpu_speed_compiled_2026-11-30.json",
                     "benchmarks.training.gpu_speed:markdown",
                     "The Transformer's rows are not its speed: the harness compiled the classifier's torchmetrics "
                     "metrics too, and a compiled metric recompiles at every step (found on CPU afterwards; mended in "
                     "`gpu_runs.CompileNetworks`, not yet rerun on a GPU)."),
             Section("Where the device time goes (2026-11-30)", "h200/gpu_profile_2026-11-30.json",
                     "benchmarks.training.gpu_profile:markdown",
                     "`python -m benchmarks.training.gpu_profile`: the kernels' own device time, summed. `_forward` and "
                     "`_backward` are the fused TT-embedding lookup (Triton): under other in the first table."),
             Section("Device model refitted on the 2026-11-30 run (not a measurement)", "h200/device_model_2026-11-30.json",
                     "benchmarks.training.device_model:markdown"),
             Section("Measured before the cuts: steps/s, bf16, batch 32", "h200/gpu_speed_2026-11-28.json",
                     "benchmarks.training.gpu_speed:markdown", "Measured before the fifth wave's step cuts."),
             Section("Modeled from the step account (not a measurement)", "device_model_h200.json",
                     "benchmarks.training.device_model:markdown",
                     "The model the cuts were planned with."),
         ]),
    Page("speed_gpu_first", "Speed on a GPU: the first device run", "What did the first H200 run (2026-11-26) measure "
         "of CUDA graphs, single layers and a TT table's lookup?", [
             Section("CUDA graphs on the paper Transformer, fp32, 2 encoders (2026-11-26)",
                     "h200/strategy_speed_2layers.json", f"{GPU}:strategy_speed",
                     "`python -m benchmarks.training.strategy_speed`: the tensorized model in the paper's layout, one "
                     "step = forward, the early-stage objective, backward, AdamW."),
             Section("The same, 6 encoders", "h200/strategy_speed_6layers.json", f"{GPU}:strategy_speed"),
             Section("One layer at a time on the H200", "h200/layer_speed.json", f"{GPU}:layer_speed"),
             Section("A 1,000,000 × 64 TT table's lookup (rank 32, Zipf ids)", "h200/tt_embedding_lookup.json",
                     f"{GPU}:tt_lookup"),
         ]),
    Page("memory", "Memory", "How much memory does training take, dense against CoMERA?", [
             Section("DLRM with Criteo's 26 tables", "dlrm_memory.json", f"{OURS}:dlrm_memory"),
             Section("The largest LLaMA-shaped model a GPU fits (modeled)", "memory_fit.json",
                     "benchmarks.training.memory_fit:markdown"),
             Section("What FSDP would save on the paper Transformer", "fsdp_memory.json", f"{SCALING}:fsdp_memory",
                     "`python -m benchmarks.scaling.fsdp_memory`: parameters, gradients and optimizer state shard; "
                     "the activations a step saves do not."),
             Section("The same, 12 layers", "fsdp_memory_12layers.json", f"{SCALING}:fsdp_memory"),
             Section("The same, batch 1", "fsdp_memory_batch1.json", f"{SCALING}:fsdp_memory"),
         ]),
    Page("scaling", "Scaling out", "What do a second process, TorchRec's pipeline and the Criteo readers give?", [
             Section("1 against 2 processes", "scaling_throughput.json", f"{SCALING}:throughput",
                     "`python -m benchmarks.scaling.throughput`: the same `comera-lightning fit` as one process of one "
                     "or two threads and as two gloo processes, alternated; `ThroughputTimer` times the batches."),
             Section("TorchRec's `TrainPipelineSparseDist` against the plain loop", "dmp_pipeline.json",
                     f"{SCALING}:rates", "A tensorized DLRM under DMP on 2 gloo processes, the same batches."),
             Section("Criteo readers", "criteo_reader.json", f"{SCALING}:rates",
                     "One synthetic TSV for every system, one process."),
             Section("Criteo readers, two DataLoader workers at a larger batch", "criteo_reader_workers.json",
                     f"{SCALING}:rates"),
         ]),
    Page("serving", "Serving", "How small and fast is a compressed model once exported?", [
             Section("The paper's Transformer and the DLRM, exported", "inference.json", f"{OURS}:inference",
                     "One thread; `python -m benchmarks.inference.latency`."),
             Section("`export(prefer=...)`: size against speed", "export_prefer.json",
                     "benchmarks.inference.export_prefer:markdown",
                     "Before the DLRM's large tables served their misses through half tables."),
             Section("The DLRM with half tables for the misses", "export_prefer_halves.json",
                     "benchmarks.inference.export_prefer:markdown"),
             Section("Embedding tables: lookups, DLRM steps and serving bytes", "embedding_speed.json",
                     f"{OURS}:stored_markdown"),
         ]),
]
