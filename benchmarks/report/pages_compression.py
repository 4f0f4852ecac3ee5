"""The results pages on compressing trained models (issue #52): language models, classifiers, tables."""

from __future__ import annotations

from benchmarks.report.page_parts import OURS, Page, Section, seeded

FRONTIER = "benchmarks.report.tables_frontier:lm_frontier"

PAIRS = seeded("compress_pairs", {"": 2, "_trained_schedule": 2, "_held_gates": 2, "_gate_lr_2e-3": 2, "_prune": 2,
                                  "_distill": 2, "_tall_tables": 2, "_ft_lr_3e-4": 2, "_ft_lr_1e-4": 4,
                                  "_ft_lr_1e-4_dense_size_start": 4, "_ft_lr_1e-4_core_steps_auto_others_2": 4,
                                  "_ft_lr_1e-4_rerun": 4, "_ft_lr_1e-4_rerun_distill": 4})
BERT = seeded("compress_pairs_bert", {"": 2, "_ft_lr_3e-4": 2, "_ft_lr_1e-4": 4, "_ft_lr_1e-4_dense_size_start": 4,
                                      "_ft_lr_1e-4_core_steps_auto_others_2": 4, "_tt_tables": 2, "_core_steps_1": 2,
                                      "_ft_lr_1e-4_rerun": 8, "_ft_lr_1e-4_rerun_distill": 8,
                                      "_ft_lr_3e-4_rerun": 8, "_ft_lr_3e-4_small_d_model_32": 8})
RERUN = ("rerun on 2026-11-30 on a fresh host, whose WordPiece vocabulary was trained anew: `tokenizers` does not "
         "reproduce one from run to run (huggingface/tokenizers#1794), so its dense models are new ones (seeds 4–7 of "
         "the BERT's added the same day on the same host and vocabulary)")
DENSE_SIZE_START = ("the start at the dense size at every budget, a probe not kept (`comera_lightning.schedule.config."
                    "START_FACTOR = 100` set before `main()`, 2026-11-30; today's start is twice the size asked)")
AUTO_OTHERS_2 = ("the default core steps (\"auto\": the token table's cores 12x) with every other TT layer's cores "
                 "stretched 2x, a probe not kept (`CoreStepScale` patched before `main()`, 2026-11-30)")
DLRM = seeded("compress_dlrm", {"": 2, "_gate_lr_1e-3": 2, "_tt_tables": 2, "_distill": 2, "_uniform": 2})

SIZES = ("Each path's validation loss at every size it was run at, from `python -m benchmarks.quality.compress --ft-lr "
         "3e-3` (`[--seed 1]`, `[--extra 0.1]`, `--compressions 2,4` / `8` / `32`): the files below and those of the "
         "other compression pages, a seed's latest rerun under a later default in place of its row (2× and 4×: "
         "[today's defaults](compression_today.md)). 10 % at 8× and 32×: `--extra 0.1 --compressions 8,32 --systems "
         "comera,svd_ft,fwsvd_ft,prune_ft [--seed 1]` (`_8x_32x_extra10`, 2026-11-30).")
#: A width-64 language model's compress files: 2x/4x, 8x, 32x at 25 % extra steps, the same at 10 %, and their reruns
#: under the token-step rule from trained weights (2026-11-30), which take the place of the rows before it.
LM_FILES = {"": 2, "_8x": 2, "_32x": 2, "_extra10": 2, "_8x_32x_extra10": 2, "_token_steps_4": 2, "_token_steps_4_extra10": 2}
TOKEN_STEPS = ("`python -m benchmarks.quality.compress --ft-lr 3e-3 --threads 1 --no-served --systems comera,svd_ft,fwsvd_ft "
               "--compressions 2,4` with the flags each file's note gives (`--vocab-size 261` for bytes, `--model "
               "gpt2:64:4` for GPT-2), 2026-11-30: today's defaults, whose token cores move 4x the optimizer's step from "
               "trained weights at 2x and 4x (12x before; [the sweep](compression_token_steps.md)), and the plain paths at "
               "their ranks; the dense models are those of the other compression pages.")
DATA_AWARE = ("Today's defaults beside the plain paths at their ranks and at ranks measured before the first step, from "
              "the trained weights of the other compression pages (each seed its own dense model), LR 3e-3; each "
              "file's command in its note (`--vocab-size 261` for bytes, `--model gpt2:64:4` for GPT-2, `--extra 0.1` "
              "for 10 %).")
HIGH = ("`python -m benchmarks.quality.compress --ft-lr 3e-3 --threads 1 --no-served --systems "
        "comera,svd_ft,fwsvd_ft,prune_ft,small` (2026-11-30), 25 % extra steps:")


def _with_fewer_steps(heading: str, stem: str, model: str) -> Section:
    """A classifier given 10 % extra steps instead of 25 %, seeds 0 and 1."""
    return Section(heading, seeded(f"{stem}_extra10", {"": 2}), f"{OURS}:pairs_by_seed",
                   f"`python -m benchmarks.quality.compress_pairs {model}--extra 0.1 [--seed 1]`: 98 extra steps; the "
                   "mean of seeds 0 and 1.")


def _at_other_sizes(heading: str, stem: str, model: str, compressions: str, seeds: int) -> Section:
    """A classifier at the sizes ``compressions``, LR 1e-4, on the first ``seeds`` rerun dense models (2026-11-30)."""
    return Section(heading, seeded(f"{stem}_ft_lr_1e-4_sizes", {"": seeds}), f"{OURS}:pairs_by_seed",
                   f"`python -m benchmarks.quality.compress_pairs {model}--ft-lr 1e-4 --compressions {compressions} "
                   "--systems comera,svd_ft,small,dense_ft --no-served --seed N` (2026-11-30), 25 % extra steps, the dense "
                   f"models of `_ft_lr_1e-4_rerun`; the mean of seeds {'0–3' if seeds == 4 else '0 and 1'}.")

#: The trained language models of width 64 the token-step runs compress, with their section names.
WIDTH_64_LMS = (("llama-64x4", "The Llama (width 64, BPE)"), ("byte_llama-64x4", "The byte Llama (width 64)"),
                ("gpt2-64x4", "GPT-2 (width 64, BPE)"))


def _width_64_sections(stem: str, title: str, note: str) -> list[Section]:
    """One section per width-64 language model and seed (``<stem>_<model>[_seed1].json``), ``note`` under the first."""
    return [Section(title.format(name=name, seed=seed), f"{stem}_{model}{'_seed1' if seed else ''}.json", f"{OURS}:compress_runs",
                    note if (model, seed) == (WIDTH_64_LMS[0][0], 0) else "")
            for model, name in WIDTH_64_LMS for seed in (0, 1)]


COMPRESSION_PAGES = [
    Page("compression", "Compression frontier", "How much loss does each size cost, from scratch and when a trained "
         "language model is compressed, against the plain paths a user would write instead?", [
             Section("From scratch: byte Llama 48×4 at 4–16×", "frontier_llama48.json",
                     "benchmarks.quality.frontier:markdown"),
             Section("From scratch: BPE GPT-2 48×2", "frontier_gpt48.json", "benchmarks.quality.frontier:markdown"),
             Section("From scratch: the late stage of a BPE Llama (width 64) at 4×, with and without the cut watch",
                     ("late_stage_llama-64x4_watch.json", "late_stage_llama-64x4_before_watch.json"), f"{OURS}:curves",
                     "`python -m benchmarks.quality --models llama:64:4 --systems comera --steps 1344`: two thirds early "
                     "(the switch after the validation at step 840), then the budget's late stage."),
             Section("From scratch: the late stage of a byte Llama (width 64) at 4×, 20 tokens per parameter",
                     ("late_stage_byte_llama-64x4.json",), f"{OURS}:curves",
                     "`python -m benchmarks.quality --models llama:64:4 --systems comera --tokens-per-param 20 "
                     "--vocab-size 261` (bytes of Python source, warm-up + cosine): two thirds early (the switch after "
                     "the fifth validation), then the budget's late stage. The issue's byte Llama measured +5.5 % at "
                     "the end of its late stage."),
             Section("A trained Llama, width 64, compressed 2× and 4×", "compress_llama-64x4.json", f"{OURS}:compress_runs",
                     "`python -m benchmarks.quality.compress` at each `--ft-lr`; 268 extra steps (25 %). The guide: "
                     "[Compress a trained model](../COMPRESS.md)."),
             Section("The same, seed 1 (its own dense model), at LR 3e-3", "compress_llama-64x4_seed1.json",
                     f"{OURS}:compress_runs"),
             Section("A trained Llama, width 96, compressed 2× and 4× (LR 3e-3)", "compress_llama-96x4.json",
                     f"{OURS}:compress_runs"),
             Section("The same width, seed 1 (its own dense model)", "compress_llama-96x4_seed1.json", f"{OURS}:compress_runs"),
         ]),
    Page("compression_gpt2", "A trained GPT-2 compressed", "A trained Hugging Face GPT-2 compressed 2× and 4×: how much "
         "loss does each size cost, against the plain paths a user would write instead?", [
             Section("A trained GPT-2 (BPE, width 64) compressed 2× and 4×", "compress_gpt2-64x4.json",
                     f"{OURS}:compress_runs",
                     "`python -m benchmarks.quality.compress --model gpt2:64:4 --ft-lr 3e-3`: Hugging Face GPT-2 from its "
                     "config (Conv1D layers, untied head), trained dense 1,080 steps, then 268 more (25 %); seed 0."),
             Section("The same GPT-2, seed 1 (its own dense model), at LR 3e-3", "compress_gpt2-64x4_seed1.json",
                     f"{OURS}:compress_runs"),
         ]),
    Page("compression_byte", "The issue's byte Llama compressed", "The byte-level Llama of issue #52's own measurement, "
         "trained dense then compressed 2× and 4×: how much loss does each size cost, against the plain paths a user would "
         "write instead?", [
             Section("A trained byte Llama (width 64) compressed 2× and 4×", "compress_byte_llama-64x4.json",
                     f"{OURS}:compress_runs",
                     "`python -m benchmarks.quality.compress --vocab-size 261 --ft-lr 3e-3` (2026-11-30): the Llama of "
                     "[Compress a trained model](../COMPRESS.md) on bytes of Python source (256 byte tokens and 5 "
                     "specials), trained dense 1,080 steps of 32 × 128 bytes, then 268 more (25 %); seed 0; `small`: a narrower "
                     "dense model from scratch for all 1,344 steps."),
             Section("The same, seed 1 (its own dense model)", "compress_byte_llama-64x4_seed1.json", f"{OURS}:compress_runs"),
             Section("The byte Llama (width 64) with 10 % extra steps", "compress_byte_llama-64x4_extra10.json",
                     f"{OURS}:compress_runs",
                     "`python -m benchmarks.quality.compress --vocab-size 261 --ft-lr 3e-3 --extra 0.1`: 108 extra steps; seed 0."),
             Section("The same with 10 % extra steps, seed 1", "compress_byte_llama-64x4_extra10_seed1.json",
                     f"{OURS}:compress_runs"),
             Section("A wider byte Llama (width 96) compressed 2× and 4×", "compress_byte_llama-96x4.json",
                     f"{OURS}:compress_runs", "`python -m benchmarks.quality.compress --model llama:96:4 --vocab-size 261 "
                     "--ft-lr 3e-3` (2026-11-30): 493,344 parameters, the same data and steps; seed 0."),
             Section("The wider byte Llama, seed 1 (its own dense model)", "compress_byte_llama-96x4_seed1.json",
                     f"{OURS}:compress_runs"),
         ]),
    Page("compression_paths", "Where the ranks go, and when they are cut", "A trained language model compressed 2× "
         "and 4×: how much is CoMERA's choice of ranks worth against one rank for every layer, and what does cutting "
         "before the first step instead of while training do?", [
             Section("The Llama (width 64, BPE), seed 0", "compress_paths_llama-64x4.json", f"{OURS}:compress_runs",
                     "`python -m benchmarks.quality.compress --ft-lr 3e-3 --systems comera,svd_ft_uniform [--extra 0.1]` "
                     "(2026-11-30), beside the plain path at comera's ranks from [the compression results](compression.md) "
                     "and two lab patches (described under the table); 268 extra steps (25 %), rows `_extra10` 108."),
             Section("The same Llama, seed 1", "compress_paths_llama-64x4_seed1.json", f"{OURS}:compress_runs"),
             Section("The byte Llama (width 64), seed 0", "compress_paths_byte_llama-64x4.json", f"{OURS}:compress_runs",
                     "The same with `--vocab-size 261`, beside [the byte Llama's results](compression_byte.md)."),
             Section("The byte Llama, seed 1", "compress_paths_byte_llama-64x4_seed1.json", f"{OURS}:compress_runs"),
             Section("GPT-2 (width 64, BPE), seed 0", "compress_paths_gpt2-64x4.json", f"{OURS}:compress_runs",
                     "The same with `--model gpt2:64:4`, beside [GPT-2's results](compression_gpt2.md)."),
             Section("GPT-2, seed 1", "compress_paths_gpt2-64x4_seed1.json", f"{OURS}:compress_runs"),
             Section("The wider Llama (width 96, BPE), seed 0", "compress_paths_llama-96x4.json", f"{OURS}:compress_runs",
                     "`--model llama:96:4 [--vocab-size 261] [--seed 1]`, 25 % extra steps: today's defaults against one "
                     "rank for every layer."),
             Section("The wider Llama, seed 1", "compress_paths_llama-96x4_seed1.json", f"{OURS}:compress_runs"),
             Section("The wider byte Llama (width 96), seed 0", "compress_paths_byte_llama-96x4.json", f"{OURS}:compress_runs"),
             Section("The wider byte Llama, seed 1", "compress_paths_byte_llama-96x4_seed1.json", f"{OURS}:compress_runs"),
         ]),
    Page("compression_probes", "The trained Llama's 2× gap, probed", "Why does CoMERA trail plain SVD + fine-tuning "
         "on a trained Llama compressed 2×, and does a teacher close it? Each probe changed one thing, from the same "
         "trained weights.", [
             Section("The trained Llama (width 64), probes of the 2× gap (seed 0, LR 3e-3)",
                     "compress_llama-64x4_probes.json", f"{OURS}:compress_runs_with_curves",
                     "Each probe's command is in the file's note; some patched a constant or a function for the run (a "
                     "probe, not an option)."),
             Section("The same probes, seed 1 (its own dense model)", "compress_llama-64x4_probes_seed1.json",
                     f"{OURS}:compress_runs_with_curves"),
             Section("The wider Llama (width 96) with the trained model as teacher, seed 0",
                     "compress_llama-96x4_teacher.json", f"{OURS}:compress_runs",
                     "Beside SVD + fine-tuning at its ranks, with and without the same teacher (2026-11-30)."),
             Section("The same, seed 1 (its own dense model)", "compress_llama-96x4_teacher_seed1.json",
                     f"{OURS}:compress_runs"),
         ]),
    Page("compression_sizes", "Trained language models from 2× to 32×", "A trained language model compressed 2×, 4×, 8× "
         "and 32×, with 25 % or 10 % extra steps: which path is best at each size, and where does a model of that size "
         "trained from scratch win?", [
             Section("The trained Llama (width 64, BPE) at every size",
                     seeded("compress_llama-64x4", LM_FILES), FRONTIER, SIZES),
             Section("The trained byte Llama (width 64) at every size",
                     seeded("compress_byte_llama-64x4", LM_FILES), FRONTIER,
                     "The same, `--vocab-size 261`."),
             Section("The trained GPT-2 (width 64, BPE) at every size",
                     seeded("compress_gpt2-64x4", LM_FILES), FRONTIER,
                     "The same, `--model gpt2:64:4`."),
             Section("The wider Llama (width 96, BPE)", seeded("compress_llama-96x4", {"": 2, "_token_steps_4": 2}), FRONTIER,
                     "The same, `--model llama:96:4`."),
             Section("The wider byte Llama (width 96)", seeded("compress_byte_llama-96x4", {"": 2, "_token_steps_4": 2}), FRONTIER,
                     "The same, `--model llama:96:4 --vocab-size 261`."),
             Section("The trained Llama (width 64) compressed 32×", "compress_llama-64x4_32x.json", f"{OURS}:compress_runs",
                     f"{HIGH} `--compressions 32 [--seed 1]`."),
             Section("The same, seed 1", "compress_llama-64x4_32x_seed1.json", f"{OURS}:compress_runs"),
             Section("The trained byte Llama (width 64) compressed 8×", "compress_byte_llama-64x4_8x.json",
                     f"{OURS}:compress_runs", "The same, `--vocab-size 261 --compressions 8 [--seed 1]`."),
             Section("The same, seed 1", "compress_byte_llama-64x4_8x_seed1.json", f"{OURS}:compress_runs"),
             Section("The trained byte Llama (width 64) compressed 32×", "compress_byte_llama-64x4_32x.json",
                     f"{OURS}:compress_runs", "The same, `--vocab-size 261 --compressions 32 [--seed 1]`."),
             Section("The same, seed 1", "compress_byte_llama-64x4_32x_seed1.json", f"{OURS}:compress_runs"),
             Section("The trained GPT-2 (width 64) compressed 8×, at LR 3e-3", "compress_gpt2-64x4_8x.json", f"{OURS}:compress_runs"),
             Section("The same GPT-2 compressed 8×, seed 1", "compress_gpt2-64x4_8x_seed1.json", f"{OURS}:compress_runs"),
             Section("The trained GPT-2 (width 64) compressed 32×", "compress_gpt2-64x4_32x.json", f"{OURS}:compress_runs",
                     "The same, `--model gpt2:64:4 --compressions 32 [--seed 1]`."),
             Section("The same, seed 1", "compress_gpt2-64x4_32x_seed1.json", f"{OURS}:compress_runs"),
         ]),
    Page("compression_budgets", "Trained language models at other budgets", "The trained Llama and GPT-2 of the "
         "compression pages given 10 % extra steps instead of 25 %, and compressed 8×: where does each path stand?", [
             Section("The trained Llama (width 64) compressed 8×, at LR 3e-3", "compress_llama-64x4_8x.json", f"{OURS}:compress_runs"),
             Section("The same Llama compressed 8×, seed 1", "compress_llama-64x4_8x_seed1.json", f"{OURS}:compress_runs"),
             Section("The trained Llama (width 64) with 10 % extra steps, at LR 3e-3", "compress_llama-64x4_extra10.json",
                     f"{OURS}:compress_runs"),
             Section("The trained Llama (width 64) with 10 % extra steps, seed 1", "compress_llama-64x4_extra10_seed1.json",
                     f"{OURS}:compress_runs"),
             Section("The trained GPT-2 (width 64) with 10 % extra steps, at LR 3e-3", "compress_gpt2-64x4_extra10.json",
                     f"{OURS}:compress_runs"),
             Section("The trained GPT-2 (width 64) with 10 % extra steps, seed 1", "compress_gpt2-64x4_extra10_seed1.json",
                     f"{OURS}:compress_runs"),
         ]),
    Page("compression_trained", "Trained classifiers compressed", "A trained classifier "
         "compressed: how much accuracy does each size keep, against the plain paths a user would write instead, "
         "and how small and fast is it served?", [
             Section("A trained sentence-pair classifier compressed 8× and 32×", PAIRS, f"{OURS}:pairs_by_seed",
                     "`python -m benchmarks.quality.compress_pairs`, 25 % extra steps; the mean of seeds 0 and 1. "
                     "`compress_pairs` ran the first trained-model schedule (5 % early, the cuts over the next 10 %), "
                     "`compress_pairs_trained_schedule` today's defaults, `compress_pairs_held_gates` the gates held at 1 "
                     "(tried, not kept), `compress_pairs_gate_lr_2e-3` a tenth of the gates' LR (tried), "
                     "`compress_pairs_prune` magnitude pruning to the weights CoMERA kept (its comera rows: the "
                     "defaults again), `compress_pairs_distill` the defaults with the trained model as teacher; "
                     "`compress_pairs_tall_tables` today's defaults (the 8,192 × 64 token table, tall, starts as two "
                     "factors), `compress_pairs_ft_lr_3e-4` and `_1e-4` the same with every run from the trained weights at "
                     "LR 3e-4 and 1e-4 (`--ft-lr`; 1e-4 on seeds 0–3, each its own dense model); "
                     f"`_ft_lr_1e-4_dense_size_start`: {DENSE_SIZE_START}; `_ft_lr_1e-4_core_steps_auto_others_2`: "
                     f"{AUTO_OTHERS_2}; `_ft_lr_1e-4_rerun`: the 1e-4 runs {RERUN}; `_ft_lr_1e-4_rerun_distill`: CoMERA on "
                     "those dense models with the trained classifier as teacher (`--callback 'distill={\"module\": \"\"}'`), beside "
                     "`svd_ft_distill`: the plain path given the same teacher."),
             _with_fewer_steps("The same classifier with 10 % extra steps", "compress_pairs", ""),
             _at_other_sizes("The same classifier at 2×, 4×, 8× and 64×, LR 1e-4", "compress_pairs", "", "2,4,8,64", 4),
             Section("A trained Hugging Face BERT classifier compressed 8× and 32×", BERT, f"{OURS}:pairs_by_seed",
                     "`python -m benchmarks.quality.compress_pairs --model bert`: `examples/huggingface.py`'s BERT (hidden "
                     "128, 2 layers, AdamW 1e-3 with a cosine over each run) on the same pairs, 25 % extra steps; the "
                     "mean of seeds 0 and 1. `compress_pairs_bert`: today's defaults (the 8,192 × 128 token table, tall, "
                     "starts as two factors, its truncated SVD); `compress_pairs_bert_ft_lr_3e-4` and `_1e-4`: the same with "
                     "every run from the trained weights at LR 3e-4 and 1e-4 (`--ft-lr`; 1e-4 on seeds 0–3, each its own "
                     "dense model); `compress_pairs_bert_tt_tables`: before, the "
                     "token table as a two-core TT-matrix; `compress_pairs_bert_core_steps_1`: that with "
                     f"`core_step_scale=1` (tried); `_ft_lr_1e-4_dense_size_start`: {DENSE_SIZE_START}; "
                     f"`_ft_lr_1e-4_core_steps_auto_others_2`: {AUTO_OTHERS_2}; `_ft_lr_1e-4_rerun`: the 1e-4 runs {RERUN}; "
                     "`_ft_lr_1e-4_rerun_distill`: CoMERA on those dense models with the trained BERT as teacher "
                     "(`--callback 'distill={\"module\": \"bert\"}'`), beside `svd_ft_distill`: the plain path given the same teacher; "
                     "`_ft_lr_3e-4_rerun`: the same eight dense models at LR 3e-4 (`--ft-lr 3e-4 --systems "
                     "comera,svd_ft,small,dense_ft --seed N`, 2026-11-30); `_ft_lr_3e-4_small_d_model_32`: the narrower BERT at "
                     "d_model 32 (the width below CoMERA's 8× size; `small` takes the nearest, 36 on seven seeds), a lab "
                     "patch of `PairModel.narrow_width` (`--systems comera,small --compressions 8`; its comera rows the "
                     "same as `_ft_lr_3e-4_rerun`'s)."),
             _with_fewer_steps("The same BERT with 10 % extra steps", "compress_pairs_bert", "--model bert "),
             _at_other_sizes("The same BERT at 2×, 4× and 64×, LR 1e-4", "compress_pairs_bert", "--model bert ", "2,4,64", 2),
         ]),
    Page("compression_masked_lm", "A trained masked LM compressed", "The package's CodeBERT-like masked LM, trained "
         "on Python source, compressed: how much masked-token accuracy does each size keep, against the plain paths?", [
             Section("A trained CodeBERT-like masked LM compressed 4× and 8×",
                     seeded("compress_codebert", {"": 2, "_dense_start": 1, "_dense_size_start": 2, "_core_steps_auto_others_2": 2,
                                                  "_token_steps_4": 2, "_token_lr": 2}),
                     f"{OURS}:pairs_by_seed", "`python -m benchmarks.quality.compress_pairs --model codebert "
                     "--compressions 4,8 [--seed 1]`: the package's `MaskedLanguageModel` at `configs/codebert_tiny.yaml`'s "
                     "shape on 200 files of the Python standard library, trained dense 976 steps, then 244 more (25 %); "
                     "accuracy is the masked-token accuracy; the mean of seeds 0 and 1. `compress_codebert_dense_start`: "
                     "4× rerun from 2026-11-29's trained start (seed 0); `compress_codebert_dense_size_start`: "
                     f"{DENSE_SIZE_START}; `compress_codebert_core_steps_auto_others_2`: {AUTO_OTHERS_2}; "
                     "`compress_codebert_token_steps_4`: the head's token cores 4x from trained weights (the rule's first "
                     "form; `--systems comera,svd_ft --no-served [--seed 1]`, 2026-11-30); `compress_codebert_token_lr`: "
                     "today's defaults (the rule holds their LR to 0.012: 12x at this LR, 1e-3; `--compressions 4`)."),
             Section("A trained CodeBERT-like masked LM at `codebert_small`'s shape compressed 4×",
                     seeded("compress_codebert_small", {"": 1, "_dense_start": 2, "_token_steps_4": 2, "_token_lr": 2}),
                     f"{OURS}:pairs_by_seed", "`python -m benchmarks.quality.compress_pairs --model codebert_small --epochs 1 "
                     "--compressions 4 --systems comera,svd_ft` (and `comera,small`: the same comera figures, the small row from "
                     "it): `configs/codebert_small.yaml`'s model (d_model 384, 4 "
                     "layers, an untied 8,192-token table and head: 13.6 M parameters) and data (600 files of the Python "
                     "standard library, blocks of 128), one LR (3e-4) for every run, trained dense one epoch (1,168 "
                     "steps), then 292 more (25 %); seed 0. `compress_codebert_small_dense_start`: the same command "
                     "(`--no-served`) after 2026-11-29's trained-start rule: the start at 2.0× smaller, was 2.5×; its seed 1 "
                     "(2026-11-30, `--systems comera,svd_ft,small --seed 1`) has its own split of the files: 1,073 dense "
                     "steps and 268 more, and its own small row. `compress_codebert_small_token_steps_4`: both seeds again "
                     "under the token-step rule's first form (4x from trained weights; `--systems comera,svd_ft --no-served "
                     "[--seed 1]`, 2026-11-30; seed 0's dense model trained anew, the same figures as before); "
                     "`compress_codebert_small_token_lr`: today's defaults (12x at this LR; ranks in 16-byte rows)."),
         ]),
    Page("compression_token_steps", "Token steps from trained weights", "How far should a trained token table's "
         "and vocabulary head's cores move per step when the model is compressed?", [
             *_width_64_sections("compress_token_steps", "{name}, seed {seed}: the token cores' step",
                                 "The token cores' step, relative to the optimizer's, from the trained weights of the "
                                 "compression pages (each seed its own dense model), 268 extra steps (25 %) and 108 (10 %, "
                                 "rows `_extra10`), LR 3e-3; today's defaults under the rule, beside the plain paths at their "
                                 "ranks: [today's defaults](compression_today.md). The rule now holds the token cores' LR to "
                                 "0.012 (4x at this LR; [at LR 1e-3](compression_token_steps_lr.md))."),
         ]),
    Page("compression_token_steps_lr", "Token steps from trained weights at LR 1e-3", "Does the token cores' best step "
         "from trained weights depend on the fine-tuning LR?",
         _width_64_sections("compress_token_steps_lr1e-3", "{name}, seed {seed}",
                            "The trained models of [the sweep](compression_token_steps.md) fine-tuned at LR 1e-3: 12x "
                            "against the trained rule's first form, 4x (since then the rule holds the token cores' LR to "
                            "0.012: 4x at LR 3e-3, 12x at 1e-3).")),
    Page("compression_today", "Trained language models under today's defaults", "Trained language models compressed 2× "
         "and 4× under today's defaults (the token-step rule from trained weights): where does CoMERA stand against the "
         "plain paths at its own ranks?", [
             Section(f"{name}, {extra} extra steps, seed {seed}", f"compress_{model}_token_steps_4{suffix}{'_seed1' if seed else ''}.json",
                     f"{OURS}:compress_runs", TOKEN_STEPS if (model, seed, suffix) == ("llama-64x4", 0, "") else "")
             for model, name in (("llama-64x4", "The Llama"), ("byte_llama-64x4", "The byte Llama"), ("gpt2-64x4", "GPT-2"),
                                 ("llama-96x4", "The wider Llama (width 96)"), ("byte_llama-96x4", "The wider byte Llama"))
             for suffix, extra in (("", "25 %"), ("_extra10", "10 %")) for seed in (0, 1)
             if not (model.endswith("96x4") and suffix)]),
    Page("compression_kfac", "Trained language models cut by what their data says", "How much does a data-aware "
         "truncation (K-FAC) give the plain path at CoMERA's ranks, and how does a one-shot cut at measured ranks "
         "compare with CoMERA's gradual one?", [
             Section(f"{name}, {extra} extra steps, seed {seed}", f"compress_{model}_kfac{suffix}{'_seed1' if seed else ''}.json",
                     f"{OURS}:compress_runs", DATA_AWARE if (model, seed, suffix) == ("llama-64x4", 0, "_extra10") else "")
             for model, name in WIDTH_64_LMS for suffix, extra in (("_extra10", "10 %"), ("", "25 %")) for seed in (0, 1)]),
    Page("compression_tables", "A trained DLRM's tables compressed", "A trained DLRM's embedding tables compressed: how "
         "much AUC does each size keep, against the plain paths a user would write instead, and how small and fast is it "
         "served?", [
             Section("A trained DLRM's tables (MovieLens-100K) compressed 4×, 8× and 32×", DLRM, f"{OURS}:dlrm_by_seed",
                     "`python -m benchmarks.quality.compress_dlrm`: the users', items' and zip codes' tables (2,975 of "
                     "3,028 rows, dim 16), 25 % extra steps; the mean of seeds 0 and 1. `compress_dlrm`: today's "
                     "defaults (a trained TorchRec table starts as two factors, its truncated SVD); "
                     "`compress_dlrm_gate_lr_1e-3`: the same with slower gates (`gate_lr=1e-3`, tried); "
                     "`compress_dlrm_tt_tables`: the four-core TT-matrix tables of before (`embedding_num_cores=4`); "
                     "`compress_dlrm_distill`: the trained DLRM as teacher (`--callback 'distill={\"module\": \"model\"}'`, "
                     "its click logit read as a Bernoulli's, 2026-11-30), beside `svd_ft_distill`: the plain path given the same teacher; "
                     "`compress_dlrm_uniform`: `--systems comera,svd_ft_uniform` (2026-11-30), one rank for the three "
                     "tables at CoMERA's size, beside CoMERA run again. At rank 1 two factors hold 2,975 + 3 × 16 parameters: 15.7× is as small as they get."),
             Section("The same with 10 % extra steps", seeded("compress_dlrm_extra10", {"": 2, "_distill": 2, "_uniform": 2}),
                     f"{OURS}:dlrm_by_seed", "`python -m benchmarks.quality.compress_dlrm --extra 0.1 [--seed 1]`: 156 extra "
                     "steps; the mean of seeds 0 and 1 (seed 1 run 2026-11-30). `compress_dlrm_extra10_distill`: the trained "
                     "DLRM as teacher, as above."),
             Section("A DLRM with 64-wide tables compressed 4×, 8×, 32× and 64×",
                     seeded("compress_dlrm_dim64", {"": 2, "_distill": 2, "_uniform": 2}), f"{OURS}:dlrm_by_seed",
                     "`python -m benchmarks.quality.compress_dlrm --embedding-dim 64 --epochs 3 --compressions 4,8,32,64 "
                     "[--seed 1]` (2026-11-30): the same data and tables at the width DLRMs use on Criteo (190,400 "
                     "parameters), trained dense 3 epochs (939 steps: seed 0's best validation AUC; seed 1's is at 2, "
                     "it overfits after; test AUC 0.7970 and 0.7817), then 235 more (25 %); the mean of seeds 0 and 1. `compress_dlrm_dim64_distill`: "
                     "the trained DLRM as teacher, beside the plain path given it; `_uniform`: one rank for the three tables, as above. "
                     "At rank 1 two factors hold 2,975 + 3 × 64 "
                     "parameters: 60× is as small as they get (64× asked ends there)."),
             Section("The 64-wide DLRM with 10 % extra steps", seeded("compress_dlrm_dim64_extra10", {"": 2, "_distill": 2, "_uniform": 2}),
                     f"{OURS}:dlrm_by_seed", "The same with `--extra 0.1`: 94 extra steps; the mean of seeds 0 and 1."),
         ]),
]
