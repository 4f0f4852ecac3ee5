"""make demo's summary."""

from __future__ import annotations


def test_demo_summary_names_the_layers_pruned_to_rank_0() -> None:
    from comera_lightning.cli.demo import format_summary

    summary = {"test_acc": 0.84, "tt_params": 11_962, "dense_tt_params": 590_464, "params": 54_461, "dense_params": 632_963,
               "model_compression": 11.6, "tt_compression": 49.4, "wall_s": 60.0, "csv_dir": "logs/x", "wandb_dir": None,
               "png": None, "tt_layers": 5, "rank0_layers": ["encoder.0.ffn.intermediate", "encoder.0.ffn.output"]}
    text = format_summary(summary)
    assert "pruned to rank 0         2 of 5 TT layers output their bias only: encoder.0.ffn.intermediate, encoder.0.ffn.output" in text
    assert "pruned to rank 0" not in format_summary({**summary, "rank0_layers": []})
