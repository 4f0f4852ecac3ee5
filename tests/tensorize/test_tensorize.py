import pytest
import torch
from torch import nn

from comera_lightning import TensorizeConfig, TTEmbedding, TTLinear, tensorize, to_dense
from comera_lightning.checkpoint import restore_tensorized
from comera_lightning.tensorize.build import pin_trained_tables


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.query = nn.Linear(64, 64)
        self.ffn = nn.Linear(64, 256)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 64, padding_idx=0)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.small = nn.Linear(4, 4)
        self.classifier = nn.Linear(64, 3)

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = h + b.ffn(b.query(h))[..., :64]
        return self.classifier(h.mean(1))


def test_default_rules_swap_big_layers_and_leave_head_and_small_ones():
    assert "include_embeddings" in dict(tensorize(Tiny(), max_rank=8, include_embeddings=False).skipped)["embed"]
    model = Tiny()
    report = tensorize(model, max_rank=8)
    assert isinstance(model.embed, TTEmbedding) and model.embed.padding_idx == 0
    assert isinstance(model.blocks[0].query, TTLinear) and isinstance(model.blocks[1].ffn, TTLinear)
    assert isinstance(model.classifier, nn.Linear) and isinstance(model.small, nn.Linear)
    skipped = dict(report.skipped)
    assert "output head" in skipped["classifier"]
    assert "too small to gain" in skipped["small"]
    assert report.layer_compression > 2 and report.model_compression > 2
    assert "blocks.0.query" in str(report)
    model(torch.randint(0, 1000, (2, 5))).sum().backward()


def test_a_token_table_becomes_a_two_core_train_at_half_its_dim_unless_told_otherwise():
    model = Tiny()
    tensorize(model)
    assert len(model.embed.cores) == 2 and max(model.embed.physical_ranks) == 32, "2 cores, rank 64 / 2"
    model = Tiny()
    tensorize(model, embedding_rank_fraction=0.25, embedding_num_cores=3)
    assert len(model.embed.cores) == 3 and max(model.embed.physical_ranks) == 16
    model = Tiny()
    tensorize(model, max_rank=8)  # max_rank caps tables too, as it always did
    assert max(model.embed.physical_ranks) == 8
    with pytest.raises(ValueError, match="embedding_rank_fraction"):
        tensorize(Tiny(), embedding_rank_fraction=1.5)


def test_name_list_matches_suffixes_and_regex_matches_whole_names():
    model = Tiny()
    report = tensorize(model, target_modules=["query"], max_rank=4)
    assert [r.name for r in report.swapped] == ["blocks.0.query", "blocks.1.query"]
    assert isinstance(model.blocks[0].ffn, nn.Linear)
    model = Tiny()
    report = tensorize(model, target_modules=r"blocks\.1\..*", max_rank=4)
    assert [r.name for r in report.swapped] == ["blocks.1.query", "blocks.1.ffn"]


def test_head_is_swapped_when_named_and_exclusions_win():
    model = Tiny()
    tensorize(model, target_modules=["classifier", "ffn"], exclude_modules=["blocks.0.ffn"], max_rank=4, min_compression=0)
    assert isinstance(model.classifier, TTLinear)
    assert isinstance(model.blocks[0].ffn, nn.Linear) and isinstance(model.blocks[1].ffn, TTLinear)


def test_per_layer_overrides():
    model = Tiny()
    report = tensorize(model, max_rank=8, num_cores=3, layer_config={"ffn": {"max_rank": 2}, "re:blocks\\.0\\.query": {"num_cores": 2}})
    assert max(model.blocks[0].ffn.physical_ranks) == 2
    assert len(model.blocks[0].query.cores) == 4 and len(model.blocks[1].query.cores) == 6
    assert report.swapped


def test_idempotent_and_to_dense_roundtrip_preserves_function():
    model = Tiny().double()
    tensorize(model, max_rank=8)
    second = tensorize(model, max_rank=8)
    assert not second.swapped and second.already_tensorized
    ids = torch.randint(0, 1000, (3, 7))
    expected = model(ids)
    names = to_dense(model)
    assert "embed" in names and isinstance(model.blocks[0].query, nn.Linear)
    torch.testing.assert_close(model(ids), expected, atol=1e-10, rtol=0)


def test_svd_init_at_full_rank_keeps_a_pretrained_model_exact():
    model = Tiny().double()
    ids = torch.randint(0, 1000, (3, 7))
    expected = model(ids)
    tensorize(model, max_rank=10_000, init="svd", min_compression=0)
    torch.testing.assert_close(model(ids), expected, atol=1e-9, rtol=0)


def test_a_token_table_is_two_factors_when_asked_and_else_a_tt_matrix_even_from_trained_weights():
    model = Tiny()
    tensorize(model, init="svd", embedding_max_rank=8, embedding_num_cores=1)
    assert model.embed.row_modes == (1000, 1) and len(model.embed.cores) == 2
    for init in ("svd", "random"):
        model = Tiny()
        tensorize(model, init=init, embedding_max_rank=8)
        assert model.embed.row_modes != (1000, 1) and len(model.embed.cores) == 2


class TallTable(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1024, 16)  # 64 rows per column: tall
        self.ffn = nn.Linear(16, 64)

    def forward(self, ids):
        return self.ffn(self.embed(ids))


def test_a_tall_trained_token_table_starts_as_two_factors_and_a_checkpoint_rebuilds_it():
    config = TensorizeConfig(init="svd", embedding_max_rank=4, min_compression=0)
    model = TallTable()
    report = tensorize(model, config)
    assert model.embed.row_modes == (1024, 1) and model.embed.ranks == (4,)
    state = model.state_dict()
    fresh = TallTable()  # what load_from_checkpoint does: the callback's record (pinned), under init="random"
    assert restore_tensorized(fresh, {"comera": {"tensorize": pin_trained_tables(config, report.swapped).to_dict()}, "state_dict": state})
    fresh.load_state_dict(state)
    ids = torch.randint(0, 1024, (3, 5))
    torch.testing.assert_close(fresh(ids), model(ids))
    chosen = [config.replace(init="random"), config.replace(embedding_num_cores=2),
              config.replace(layer_config={"embed": {"num_cores": 2}})]
    for other in chosen:  # from scratch, or a layout asked for: the TT-matrix
        model = TallTable()
        tensorize(model, other)
        assert model.embed.row_modes != (1024, 1) and len(model.embed.cores) == 2


def test_random_init_matches_the_scale_of_the_replaced_layer():
    model = Tiny()
    std = model.blocks[0].ffn.weight.std().item()
    tensorize(model, target_modules=["blocks.0.ffn"], max_rank=8)
    assert 0.6 * std < model.blocks[0].ffn.to_linear().weight.std().item() < 1.4 * std


def test_shared_module_is_swapped_under_every_name():
    model = Tiny()
    model.blocks[1].query = model.blocks[0].query
    tensorize(model, target_modules=["query"], max_rank=4)
    assert model.blocks[1].query is model.blocks[0].query and isinstance(model.blocks[0].query, TTLinear)


def test_tied_weights_are_left_alone_with_a_reason():
    model = Tiny()
    model.blocks[0].query.weight = model.blocks[1].query.weight
    report = tensorize(model, max_rank=4)
    reasons = dict(report.skipped)
    assert "tied" in reasons["blocks.0.query"] and "tied" in reasons["blocks.1.query"]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(target_modules=["nonexistent"]), r"target_modules entries \['nonexistent'\] match no module"),
        (dict(exclude_modules=["typo"]), r"exclude_modules entries \['typo'\]"),
        (dict(target_modules="zzz.*"), r"target_modules entries \['zzz.\*'\]"),
        (dict(target_modules="(unclosed"), "not a valid regular expression"),
        (dict(max_rank=0), r"max_rank must be an integer >= 1 \(or a list of them\), got 0"),
        (dict(init="xavier"), "init='xavier'"),
        (dict(layer_config={"ffn": {"rank": 3}}), r"unknown keys \['rank'\]"),
        (dict(layer_config={"ffn": {"row_modes": (2, 2)}}), "do not apply to blocks.0.ffn"),
        (dict(target_modules=["small"], rank_fraction=1.0), "found nothing to swap"),
    ],
)
def test_bad_rules_raise_value_error_naming_them(kwargs, match):
    model = Tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=match):
        tensorize(model, **kwargs)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "a failed tensorize must not change the model"


def test_a_module_of_an_unhandled_type_with_a_large_weight_is_listed_as_skipped():
    model = nn.Sequential(nn.Conv2d(16, 64, 3), nn.Flatten(), nn.Linear(64, 256), nn.Linear(256, 256), nn.Linear(256, 4))
    report = tensorize(model, max_rank=4)
    assert "Conv2d with a 64x16x3x3 weight has no TT converter" in dict(report.skipped)["0"]


class SmallLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.lm_head = nn.Linear(64, 1000)


def test_a_vocabulary_head_is_tensorized_by_default_a_classifier_stays_dense():
    model = SmallLM()
    assert "lm_head" in {r.name for r in tensorize(model).swapped}
    assert model.lm_head.physical_ranks == (24,)  # head_rank_fraction 3/8 of the width 64
    wider = SmallLM()
    tensorize(wider, head_rank_fraction=0.5)
    assert wider.lm_head.physical_ranks == (32,) and wider.blocks[0].ffn.physical_ranks == (16,)  # other layers: rank_fraction
    with pytest.raises(ValueError, match="head_rank_fraction"):
        tensorize(SmallLM(), head_rank_fraction=0.0)
    assert "include_heads=False" in dict(tensorize(SmallLM(), include_heads=False).skipped)["lm_head"]
    assert "fewer outputs than inputs" in dict(tensorize(Tiny()).skipped)["classifier"]  # 64 -> 3 classes


def test_a_checkpoint_record_older_than_include_heads_rebuilds_dense_heads():
    from comera_lightning import TensorizeConfig

    record = TensorizeConfig().to_dict()
    del record["include_heads"]  # what checkpoints written before the option hold
    assert TensorizeConfig.from_record(record).include_heads is False
    assert TensorizeConfig.from_dict(record).include_heads is True  # a user's mapping takes today's default
    assert TensorizeConfig.from_record({**record, "include_heads": True}).include_heads is True


def test_an_older_checkpoint_loads_with_its_head_dense_and_todays_defaults_are_told_what_to_give():
    from comera_lightning import TensorizeConfig
    from comera_lightning.checkpoint import restore_tensorized

    written = SmallLM()
    tensorize(written, include_heads=False)  # what the code before the option did
    record = TensorizeConfig().to_dict()
    del record["include_heads"]
    checkpoint = {"comera": {"tensorize": record}, "state_dict": written.state_dict()}
    loaded = SmallLM()
    assert restore_tensorized(loaded, checkpoint) and isinstance(loaded.lm_head, nn.Linear)
    loaded.load_state_dict(checkpoint["state_dict"])
    today = SmallLM()
    tensorize(today)
    with pytest.raises(ValueError, match="predates 'include_heads': give include_heads=False"):
        restore_tensorized(today, checkpoint)


class AttentionBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.ModuleDict({"q": nn.Linear(64, 64), "o": nn.Linear(64, 64)})
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)
        self.head = nn.Linear(64, 10)


def test_attention_projections_stay_dense_by_default_and_join_on_request():
    report = tensorize(AttentionBlock())
    skipped = dict(report.skipped)
    assert "include_attention" in skipped["attn.q"] and "include_attention" in skipped["attn.o"]
    assert {r.name for r in report.swapped} == {"up", "down"}
    assert {r.name for r in tensorize(AttentionBlock(), include_attention=True).swapped} == {"attn.q", "attn.o", "up", "down"}
    assert {r.name for r in tensorize(AttentionBlock(), target_modules=["attn.q"]).swapped} == {"attn.q"}


def test_default_rank_is_a_quarter_of_the_smaller_side_and_max_rank_overrides_it():
    model = AttentionBlock()
    tensorize(model)
    assert model.up.physical_ranks == (16,) and model.down.physical_ranks == (16,)
    model = AttentionBlock()
    tensorize(model, max_rank=4, rank_fraction=0.5)
    assert model.up.physical_ranks == (4,)
    model = AttentionBlock()
    tensorize(model, rank_fraction=0.5, layer_config={"down": {"rank_fraction": 0.125}})
    assert model.up.physical_ranks == (32,) and model.down.physical_ranks == (8,)


def test_a_model_on_the_meta_device_is_tensorized_to_the_same_sizes():
    """Sizes without values (planning a model too large to build): the same layers and parameter counts as on CPU."""
    torch.manual_seed(0)
    on_cpu = Tiny()
    with torch.device("meta"):
        on_meta = Tiny()
    reports = [tensorize(model) for model in (on_cpu, on_meta)]
    assert [r.name for r in reports[0].swapped] == [r.name for r in reports[1].swapped]
    assert [p.shape for p in on_cpu.parameters()] == [p.shape for p in on_meta.parameters()]
    assert all(p.is_meta for p in on_meta.parameters())


@pytest.mark.parametrize(("width", "fraction", "rank"), [(512, 0.434, 216), (1024, 0.3, 304), (512, 0.1, 51), (128, 0.55, 70)],
                         ids=["gpu-width-rounds-down", "wider", "small-rank-kept", "cpu-width-kept"])
def test_ranks_from_a_fraction_are_whole_16_byte_rows_on_gpu_sized_layers(width, fraction, rank):
    # 0.434 x 512 = 222.2: a rank of 222 ran cuBLAS's align-1 kernels on the H200; 216 keeps bf16 rows in 16 bytes
    model = nn.Sequential(nn.Linear(width, 1376))
    tensorize(model, rank_fraction=fraction)
    assert model[0].physical_ranks == (rank,)
    chosen = nn.Sequential(nn.Linear(512, 1376))
    tensorize(chosen, max_rank=222)  # a rank the user chose is kept
    assert chosen[0].physical_ranks == (222,)
