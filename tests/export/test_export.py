"""comera_lightning.export: trained tensorized models as plain-PyTorch programs, loaded where comera_lightning is not."""

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from comera_lightning import export, tensorize
from comera_lightning.export.dlrm import feature_names, kjt_to_ids
from comera_lightning.rank import prune_, tt_layers

# Exported factors are contracted in another order than TTLinear's forward: float32 rounding only.
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}

# Run in a fresh interpreter that refuses to import comera_lightning, lightning, torchrec and transformers.
LOADER = textwrap.dedent("""
    import sys
    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"comera_lightning", "lightning", "torchrec", "transformers", "fbgemm_gpu"}:
                raise ImportError("blocked: " + name)
    sys.meta_path.insert(0, Refuse())
    import torch
    inputs, expected = torch.load(sys.argv[2])
    program = torch.export.load(sys.argv[1])
    with torch.no_grad():
        out = program.module()(*inputs)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert not [m for m in sys.modules if m.split(".")[0] in {"comera_lightning", "lightning", "torchrec"}]
    print("ok", tuple(out.shape))
""")


def train_and_prune_(model, loss_of, steps: int = 3) -> None:
    """A few optimizer steps, then half of every bond's gates zeroed and pruned: a small 'trained, late-stage' model."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss_of(model).backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        for _, layer in tt_layers(model):
            for gate in layer.gates:
                gate[max(1, gate.numel() // 2):] = 0.0
    assert prune_(model, [optimizer]).removed
    model.eval()


def token_inputs(batch: int, seq: int, vocab: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=generator)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, seq // 2:] = 0
    return ids, mask, torch.zeros(batch, seq, dtype=torch.long)


def classifier():
    from comera_lightning.models.transformer import SentencePairClassifier

    torch.manual_seed(0)
    model = SentencePairClassifier(vocab_size=3000, d_model=64, num_layers=2, num_heads=4, d_ff=128, max_positions=32, num_classes=3)
    tensorize(model, max_rank=8, embedding_max_rank=8, init="random", min_compression=0.0)
    inputs = token_inputs(4, 32, 3000)
    train_and_prune_(model, lambda m: F.cross_entropy(m(*inputs), torch.tensor([0, 1, 2, 0])))
    return model, inputs, token_inputs(3, 24, 3000, seed=1)


def masked_lm():
    from comera_lightning.models.codebert import MaskedLanguageModel

    torch.manual_seed(0)
    model = MaskedLanguageModel(vocab_size=2000, d_model=64, num_layers=2, num_heads=4, d_ff=128, max_positions=32)
    tensorize(model, max_rank=8, embedding_max_rank=8, init="random", min_compression=0.0)
    ids, mask, _ = token_inputs(4, 32, 2000)
    train_and_prune_(model, lambda m: F.cross_entropy(m(ids, mask).flatten(0, 1), ids.flatten()))
    other_ids, other_mask, _ = token_inputs(2, 16, 2000, seed=1)
    return model, (ids, mask), (other_ids, other_mask)


def click_batch(batch: int, seed: int):
    from torchrec import KeyedJaggedTensor

    generator = torch.Generator().manual_seed(seed)
    keys, sizes = ["user", "item", "genre"], [5000, 3000, 20]
    lengths = torch.randint(0, 3, (len(keys), batch), generator=generator)  # multi-hot bags, some empty
    values = torch.cat([torch.randint(0, size, (int(n),), generator=generator) for size, n in zip(sizes, lengths.sum(1))])
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths.flatten())
    return torch.randn(batch, 4, generator=generator), kjt


def dlrm():
    pytest.importorskip("torchrec")
    from comera_lightning.models.dlrm import DLRMClassifier

    torch.manual_seed(0)
    model = DLRMClassifier(table_sizes=[5000, 3000, 20], num_dense=4, feature_names=["user", "item", "genre"], embedding_dim=8,
                           dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])
    tensorize(model, max_rank=8, init="random", target_modules=["model.sparse_arch.embedding_bag_collection"], min_compression=0.0)
    dense, kjt = click_batch(6, 0)
    train_and_prune_(model, lambda m: F.binary_cross_entropy_with_logits(m(dense, kjt), torch.ones(6)))
    return model, dense, kjt


def run_without_comera(tmp_path, program_path, inputs, expected) -> str:
    data = tmp_path / "io.pt"
    torch.save((inputs, expected), data)
    done = subprocess.run([sys.executable, "-c", LOADER, str(program_path), str(data)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("build", [classifier, masked_lm])
def test_token_models_export_equal_and_load_with_torch_alone(build, tmp_path):
    model, inputs, other = build()
    path = tmp_path / "model.pt2"
    program = export(model, inputs, path)
    assert isinstance(program, torch.export.ExportedProgram) and path.is_file()
    assert not any(".gates." in name or "alive_" in name for name in program.state_dict), "TT layers in their inference form"
    with torch.no_grad():
        for batch in (inputs, other):  # another batch size and length: the shapes stay dynamic
            torch.testing.assert_close(program.module()(*batch), model(*batch), **TOLERANCE)
        expected = model(*other)
    assert run_without_comera(tmp_path, path, other, expected).startswith("ok")


def test_dlrm_exports_a_dense_entry_point_equal_to_the_kjt_model(tmp_path):
    model, dense, kjt = dlrm()
    names = feature_names(model)
    assert names == ["user", "item", "genre"]
    path = tmp_path / "dlrm.pt2"
    export(model, (dense, kjt_to_ids(kjt, names)), path)
    other_dense, other_kjt = click_batch(9, 1)
    ids = kjt_to_ids(other_kjt, names, length=4)  # longer padding than needed: same logits
    with torch.no_grad():
        expected = model(other_dense, other_kjt)
    assert ids.shape == (9, 3, 4) and (ids == -1).any()
    assert "ok (9,)" in run_without_comera(tmp_path, path, (other_dense, ids), expected)


def test_export_keeps_the_model_and_refuses_to_overwrite(tmp_path):
    model, inputs, _ = classifier()
    with torch.no_grad():
        before = model(*inputs)
    layers = [name for name, _ in tt_layers(model)]
    path = tmp_path / "model.pt2"
    path.write_bytes(b"the user's file")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export(model, inputs, path)
    assert path.read_bytes() == b"the user's file"
    export(model, inputs, path, overwrite=True)
    assert [name for name, _ in tt_layers(model)] == layers
    with torch.no_grad():
        torch.testing.assert_close(model(*inputs), before, rtol=0, atol=0)
    assert not list(tmp_path.glob(".*partial*"))


def test_an_exported_tt_table_holds_its_cores_and_the_hot_rows_asked_for_not_half_tables(tmp_path):
    from comera_lightning import TTEmbedding
    from comera_lightning.export import export_with_report
    from tests.layers.test_hot_rows import zipf_ids

    torch.manual_seed(0)
    rows = 2_000_000
    model = torch.nn.Sequential(TTEmbedding(rows, 16, max_rank=8, num_cores=3, cache_rows=4096))
    for seed in range(3):  # training-mode forwards count the ids
        model(zipf_ids(4096, rows, seed))
    model.eval()
    path = tmp_path / "table.pt2"
    program, report = export_with_report(model, (zipf_ids(64, rows, 7).int(),), path, hot_rows=True)  # int32 ids, as the eager layer takes them
    stored = sum(t.numel() * t.element_size() for t in (*program.state_dict.values(), *program.constants.values()))
    cores = sum(c.numel() * c.element_size() for c in model[0].cores)
    cache = 4096 * 16 * 4 + 2 * 8192 * (8 + 4)  # rows + hash index (at most int64 tags and int32 positions)
    half_tables = min(sum(t.numel() for t in model[0].half_tables(s)) for s in (1, 2)) * 4
    assert report.program_bytes == stored == report.layers[0].nbytes and "hot rows" in report.layers[0].form
    assert cores + 1000 * 16 * 4 < stored <= 2 * cores + cache < half_tables  # (thousands of hot rows: the ids counted)
    other = zipf_ids(300, rows, 11).int()
    with torch.no_grad():
        expected = model(other)
    assert "ok (300, 16)" in run_without_comera(tmp_path, path, (other,), expected)


def test_a_table_form_with_miss_tables_serves_misses_from_the_half_tables_and_loads_with_torch_alone(tmp_path):
    from comera_lightning import TTEmbedding
    from comera_lightning.export.choice import embedding_form
    from comera_lightning.export.forms import CoresEmbedding
    from tests.layers.test_hot_rows import zipf_ids

    torch.manual_seed(0)
    rows = 200_000
    layer = TTEmbedding(rows, 64, max_rank=8, num_cores=4, cache_rows=2_000)
    layer.count_ids(zipf_ids(20_000, rows, seed=1))
    layer.eval()
    chosen = embedding_form(layer, hot_rows=True, miss_tables=True)
    form = chosen.module
    assert isinstance(form, CoresEmbedding) and not len(form.cores) and form.num_hot_rows  # half tables instead of cores
    assert chosen.form == f"half tables + {form.num_hot_rows:,} hot rows"
    stored = sum(t.numel() for t in form.buffers())
    assert stored >= sum(t.numel() for t in layer.half_tables(layer.best_split(1)))
    ids = zipf_ids(600, rows, seed=5).view(100, 6)
    with torch.no_grad():
        expected = layer(ids)
        torch.testing.assert_close(form(ids), expected, rtol=1e-5, atol=1e-5)
        cores = embedding_form(layer, hot_rows=True).module  # the cores' chain agrees
        torch.testing.assert_close(form(ids), cores(ids), rtol=1e-5, atol=1e-5)
        hot = form.hot_rows[form.position[form.tags >= 0].long()]  # the cached rows: the same bits as contracted misses
        assert torch.equal(hot, form._contract(form.tags[form.tags >= 0].long()))
    path = tmp_path / "table.pt2"
    auto = torch.export.Dim.AUTO
    torch.export.save(torch.export.export(form, (ids,), dynamic_shapes=({0: auto, 1: auto},)), path)
    other = zipf_ids(300, rows, seed=11).view(50, 6)
    with torch.no_grad():
        assert "ok (50, 6, 64)" in run_without_comera(tmp_path, path, (other,), layer(other))
