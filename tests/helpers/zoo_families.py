"""The model families of the compatibility matrix (tests/tensorize/test_zoo.py): tiny, random-init, built offline.

Each ``Family`` builds a model whose ``forward(*inputs)`` returns one tensor (Hugging Face models are wrapped in
``Logits``, which picks ``.logits`` out of their output), with seeded inputs, and names what to tensorize: explicit
``target_modules`` (attention projections included whatever ``TensorizeConfig``'s defaults become), so the report,
not a default-dependent count, says what happened. ``tests/scripts/zoo_reload_script.py`` rebuilds a family by name.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

#: The TT shape of every family (explicit: the matrix must not move when the defaults do).
TT = {"max_rank": 8, "num_cores": 3, "init": "random"}
VOCAB, WIDTH, FFN, SEQ, BATCH = 512, 128, 256, 12, 4


@dataclass(frozen=True)
class Family:
    """One row of the matrix: how to build the model and its inputs, what to tensorize."""

    key: str
    library: str
    family: str
    package: str  # the optional package it needs (skipped with the reason when missing)
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple]  # seed -> forward's positional inputs
    targets: list[str]
    options: dict[str, Any] = field(default_factory=dict)
    export_inputs: Callable[[nn.Module, tuple], tuple] | None = None  # forward's inputs -> the exported program's
    known_failures: dict[str, str] = field(default_factory=dict)  # step -> why it fails today (a strict xfail)

    def tensorize_options(self) -> dict[str, Any]:
        """What the matrix passes to ``tensorize`` for this family."""
        return {**TT, "target_modules": self.targets, **self.options}

    def missing(self) -> str | None:
        """Why the family cannot run here (its package is not installed), or None."""
        if importlib.util.find_spec(self.package) is None:
            return f"{self.package} is not installed (pip install 'comera_lightning[dev]', or make setup)"
        return None


class Logits(nn.Module):
    """A Hugging Face model called with keyword tensors, returning its ``.logits`` (so export and compile see tensors)."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, first: torch.Tensor, second: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(**dict(zip(self.keys, (first, second)))).logits


def _tokens(seed: int, count: int = 1, length: int = SEQ) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(1, VOCAB, (BATCH, length), generator=g) for _ in range(count))


def _floats(seed: int, *shapes: tuple[int, ...]) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for shape in shapes)


# ---------------------------------------------------------------------- torch and Lightning
def _torch_transformer() -> nn.Module:
    torch.manual_seed(0)
    return nn.Transformer(WIDTH, 4, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=FFN, dropout=0.0, batch_first=True)


def _torch_encoder() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(WIDTH, 4, FFN, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def _lightning_demo() -> nn.Module:
    from lightning.pytorch.demos.transformer import Transformer

    torch.manual_seed(0)
    return Transformer(vocab_size=VOCAB, ninp=WIDTH, nhead=4, nhid=FFN, nlayers=1, dropout=0.0)


# ---------------------------------------------------------------------- Hugging Face transformers
def _hf(model_class: str, config_class: str, keys: tuple[str, ...], **config: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        torch.manual_seed(0)
        settings = {"vocab_size": VOCAB, "use_cache": False, **config}
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**settings))
        return Logits(model, keys)

    return build


_DECODER = {"hidden_size": WIDTH, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": FFN, "max_position_embeddings": 64}
_ENCODER = {"hidden_size": WIDTH, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": FFN}
_LLAMA_LIKE = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens"]
_WHISPER = {"num_mel_bins": 16, "d_model": WIDTH, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 4,
            "decoder_attention_heads": 4, "encoder_ffn_dim": FFN, "decoder_ffn_dim": FFN, "max_source_positions": 16,
            "max_target_positions": 32, "decoder_start_token_id": 1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


# ---------------------------------------------------------------------- litgpt
def _litgpt() -> nn.Module:
    import litgpt

    torch.manual_seed(0)
    config = litgpt.Config(block_size=64, vocab_size=VOCAB, padded_vocab_size=VOCAB, n_layer=2, n_head=4, n_embd=WIDTH,
                           n_query_groups=2, intermediate_size=FFN, mlp_class_name="LLaMAMLP", bias=False,
                           norm_class_name="RMSNorm", parallel_residual=False, rotary_percentage=1.0)
    return litgpt.GPT(config)


# ---------------------------------------------------------------------- TorchRec
TABLES = (("user", 5000), ("item", 3000), ("genre", 24))


def _dlrm(dcn: bool) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
        from torchrec.models.dlrm import DLRM, DLRM_DCN

        torch.manual_seed(0)
        tables = [EmbeddingBagConfig(name=f"t_{name}", embedding_dim=16, num_embeddings=rows, feature_names=[name])
                  for name, rows in TABLES]
        common = {"embedding_bag_collection": EmbeddingBagCollection(tables=tables), "dense_in_features": 4,
                  "dense_arch_layer_sizes": [32, 16], "over_arch_layer_sizes": [32, 1]}
        return DLRM_DCN(**common, dcn_num_layers=2, dcn_low_rank_dim=4) if dcn else DLRM(**common)

    return build


def _clicks(seed: int) -> tuple:
    from torchrec import KeyedJaggedTensor

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (len(TABLES), BATCH), generator=g)  # multi-hot bags, some empty
    values = torch.cat([torch.randint(0, rows, (int(n),), generator=g) for (_, rows), n in zip(TABLES, lengths.sum(1))])
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[n for n, _ in TABLES], values=values, lengths=lengths.flatten())
    return torch.randn(BATCH, 4, generator=g), kjt


def _dense_ids(model: nn.Module, inputs: tuple) -> tuple:
    """The DLRM's export entry point takes ``(dense, ids)`` instead of a KeyedJaggedTensor (docs/INFERENCE_EXPORT.md)."""
    from comera_lightning.export.dlrm import feature_names, kjt_to_ids

    return inputs[0], kjt_to_ids(inputs[1], feature_names(model))


FAMILIES: list[Family] = [
    Family("torch-transformer", "torch", "nn.Transformer", "torch", _torch_transformer,
           lambda s: _floats(s, (BATCH, SEQ, WIDTH), (BATCH, SEQ, WIDTH)), ["self_attn", "multihead_attn", "linear1", "linear2"]),
    Family("torch-encoder", "torch", "nn.TransformerEncoder", "torch", _torch_encoder,
           lambda s: _floats(s, (BATCH, SEQ, WIDTH)), ["self_attn", "linear1", "linear2"]),
    Family("lightning-demo", "lightning", "demos.transformer.Transformer (nn.Transformer LM)", "lightning", _lightning_demo,
           lambda s: _tokens(s, 2), ["self_attn", "multihead_attn", "linear1", "linear2", "embedding"]),
    Family("hf-bert", "transformers", "BERT (BertForSequenceClassification)", "transformers",
           _hf("BertForSequenceClassification", "BertConfig", ("input_ids",), **_ENCODER, num_labels=3,
               max_position_embeddings=64), _tokens, ["query", "key", "value", "dense", "word_embeddings"]),
    Family("hf-gpt2", "transformers", "GPT-2 (GPT2LMHeadModel)", "transformers",
           _hf("GPT2LMHeadModel", "GPT2Config", ("input_ids",), n_embd=WIDTH, n_layer=1, n_head=4, n_positions=64),
           _tokens, ["c_attn", "c_proj", "c_fc", "wte"]),
    Family("hf-llama", "transformers", "Llama (LlamaForCausalLM)", "transformers",
           _hf("LlamaForCausalLM", "LlamaConfig", ("input_ids",), **_DECODER), _tokens, _LLAMA_LIKE),
    Family("hf-qwen2", "transformers", "Qwen2 (Qwen2ForCausalLM)", "transformers",
           _hf("Qwen2ForCausalLM", "Qwen2Config", ("input_ids",), **_DECODER), _tokens, _LLAMA_LIKE),
    Family("hf-t5", "transformers", "T5 (T5ForConditionalGeneration)", "transformers",
           _hf("T5ForConditionalGeneration", "T5Config", ("input_ids", "decoder_input_ids"), d_model=WIDTH, d_kv=32,
               d_ff=FFN, num_layers=1, num_decoder_layers=1, num_heads=4, decoder_start_token_id=0),
           lambda s: _tokens(s, 2), ["q", "k", "v", "o", "wi", "wo", "shared"]),
    Family("hf-vit", "transformers", "ViT (ViTForImageClassification)", "transformers",
           _hf("ViTForImageClassification", "ViTConfig", ("pixel_values",), **_ENCODER, image_size=32, patch_size=8,
               num_labels=10), lambda s: _floats(s, (BATCH, 3, 32, 32)), ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"]),
    Family("hf-whisper", "transformers", "Whisper (WhisperForConditionalGeneration)", "transformers",
           _hf("WhisperForConditionalGeneration", "WhisperConfig", ("input_features", "decoder_input_ids"), **_WHISPER),
           lambda s: (*_floats(s, (BATCH, 16, 32)), *_tokens(s)), ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]),
    Family("litgpt", "litgpt", "GPT (LLaMA-style config)", "litgpt", _litgpt, _tokens, ["qkv", "proj", "fc_1", "fc_2", "wte"]),
    Family("torchrec-dlrm", "torchrec", "DLRM", "torchrec", _dlrm(False), _clicks, ["sparse_arch.embedding_bag_collection"],
           {"min_compression": 0.0}, _dense_ids),
    Family("torchrec-dlrm-dcn", "torchrec", "DLRM_DCN", "torchrec", _dlrm(True), _clicks, ["sparse_arch.embedding_bag_collection"],
           {"min_compression": 0.0}, _dense_ids),
]
BY_KEY = {f.key: f for f in FAMILIES}
