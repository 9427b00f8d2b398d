"""Tests for adloco_hf.data: built-in corpus, C4 path (offline), tokenizer, split, packing and caching."""

import glob
import hashlib
import json
import os
import re
import socket
import subprocess
import sys

import datasets
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from adloco_hf import data
from adloco_hf.data import (
    BUILTIN_CORPUS,
    EOS_TOKEN,
    build_lm_datasets,
    lm_dataset_stats,
    load_builtin_corpus,
    load_c4,
    load_or_train_tokenizer,
    load_text_corpus,
    train_tokenizer,
)


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SENTINEL = re.compile(r"zqk\d{3}")
WORDS = (
    "the model reads a stream of tokens and learns to predict the next one while workers average their "
    "parameters every round so that each instance moves as one and the batch grows when the gradient is noisy"
).split()


@pytest.fixture(autouse=True)
def _isolated_datasets_cache(tmp_path, monkeypatch):
    # Streamed documents are materialised in datasets' cache: keep each test's copy in its own tmp_path.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = load_builtin_corpus().select(range(120))
    return train_tokenizer(texts, vocab_size=512, save_dir=str(tmp_path_factory.mktemp("tokenizer")))


def sentinel_documents(num_documents: int, *, min_words: int = 40) -> list[str]:
    """ASCII documents that each start with a unique sentinel word (`zqk007`) and have varied lengths."""
    docs = []
    for i in range(num_documents):
        n = min_words + (7 * i) % 23
        body = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(n))
        docs.append(f"zqk{i:03d} {body}, (case {i}).\n\nEnd of note {i}.")
    return docs


def packed_stream(split: datasets.Dataset) -> list[int]:
    return [token for block in split["input_ids"] for token in block]


def write_c4_jsonl(path, num_documents: int) -> list[str]:
    docs = sentinel_documents(num_documents)
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(docs):
            record = {
                "text": text,
                "timestamp": f"2019-04-{i % 28 + 1:02d}T12:00:00Z",
                "url": f"https://example.org/{i}",
            }
            f.write(json.dumps(record) + "\n")
    return docs


# ------------------------------------------------------------------------------------------------------------------
# Built-in corpus
# ------------------------------------------------------------------------------------------------------------------


def test_builtin_corpus_is_non_empty_unique_english_text_of_the_expected_size():
    corpus = load_builtin_corpus()
    texts = corpus["text"]
    assert corpus.column_names == ["text"]
    assert len(texts) > 200
    assert all(isinstance(t, str) for t in texts)
    assert min(len(t) for t in texts) >= 200  # empty and very short docs are dropped
    assert len(set(texts)) == len(texts)
    assert 1_200_000 <= sum(len(t) for t in texts) <= 2_500_000
    joined = "\n".join(texts)
    assert 'The "if" statement' in joined  # a pydoc topic
    assert "Return the absolute value of the argument." in joined  # builtins.abs
    assert "antigravity" not in joined and "xkcd" not in joined


def test_builtin_corpus_is_deterministic_and_isolated_from_the_caller():
    first, second = load_builtin_corpus(), load_builtin_corpus()
    assert first is not second  # a fresh object per call: set_format on one cannot leak into the other
    assert first["text"] == second["text"]
    assert first._fingerprint == second._fingerprint
    # Modules are imported in a child interpreter: the corpus documents nntplib, the caller never imported it.
    assert any("NNTP" in t for t in first["text"])
    assert "nntplib" not in sys.modules

    # Same rows and fingerprint in a fresh interpreter (what makes downstream caches hit across runs).
    digest = hashlib.sha256("\0".join(first["text"]).encode()).hexdigest()
    code = (
        "import hashlib; from adloco_hf.data import load_builtin_corpus; c = load_builtin_corpus(); "
        "print(hashlib.sha256('\\0'.join(c['text']).encode()).hexdigest(), c._fingerprint)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [digest, first._fingerprint]


def test_load_text_corpus_builtin_takes_the_first_documents():
    corpus = load_builtin_corpus()
    head = load_text_corpus(BUILTIN_CORPUS, num_documents=5)
    assert head["text"] == corpus["text"][:5]
    assert len(load_text_corpus(BUILTIN_CORPUS)) == len(corpus)


# ------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ------------------------------------------------------------------------------------------------------------------


def test_trained_tokenizer_round_trips_and_has_its_special_token(tokenizer):
    assert len(tokenizer) == 512
    assert tokenizer.eos_token == EOS_TOKEN
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    samples = [
        "Return the absolute value of the argument.",
        "  leading spaces,\ttabs\nand new lines ; odd  spacing . ( x )",
        "def f(x):\n    return x ** 2  # zqk123 ~!@#$%^&*",
    ]
    for text in samples:
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.eos_token_id not in ids  # no special token is added while encoding
        assert tokenizer.decode(ids) == text


def test_train_tokenizer_reuses_the_saved_tokenizer(tmp_path, monkeypatch):
    texts = load_builtin_corpus().select(range(40))
    save_dir = str(tmp_path / "tok")
    first = train_tokenizer(texts, vocab_size=300, save_dir=save_dir)
    saved = os.path.join(save_dir, "tokenizer.json")
    mtime = os.stat(saved).st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("the tokenizer was trained again")

    monkeypatch.setattr(data.tokenizer, "_train_byte_level_bpe", no_training)
    second = train_tokenizer(texts, vocab_size=300, save_dir=save_dir)
    assert second.get_vocab() == first.get_vocab()
    assert os.stat(saved).st_mtime_ns == mtime
    assert not [name for name in os.listdir(save_dir) if name.startswith(".tmp")]

    # Another vocab_size or other texts are a different tokenizer: training must run.
    with pytest.raises(AssertionError, match="trained again"):
        train_tokenizer(texts, vocab_size=320, save_dir=save_dir)
    with pytest.raises(AssertionError, match="trained again"):
        train_tokenizer(texts.select(range(30)), vocab_size=300, save_dir=save_dir)


def test_load_or_train_tokenizer_caches_by_fingerprint_and_loads_paths(tmp_path):
    texts = load_builtin_corpus().select(range(40))
    cache_dir = str(tmp_path / "cache")
    trained = load_or_train_tokenizer(None, texts, vocab_size=300, cache_dir=cache_dir)
    again = load_or_train_tokenizer(None, texts, vocab_size=300, cache_dir=cache_dir)
    assert len(glob.glob(os.path.join(cache_dir, "tokenizer-*"))) == 1
    assert again.name_or_path == trained.name_or_path

    # A pretrained tokenizer without a pad token gets its eos token as pad.
    trained.pad_token = None
    trained.save_pretrained(tmp_path / "no_pad")
    loaded = load_or_train_tokenizer(str(tmp_path / "no_pad"), texts, vocab_size=300, cache_dir=cache_dir)
    assert loaded.pad_token == loaded.eos_token == EOS_TOKEN


# ------------------------------------------------------------------------------------------------------------------
# Split and packing
# ------------------------------------------------------------------------------------------------------------------


def test_packing_keeps_every_document_boundary_and_splits_by_document(tokenizer):
    block_size = 16
    docs = sentinel_documents(40)
    lengths = [len(tokenizer(d, add_special_tokens=False)["input_ids"]) + 1 for d in docs]
    # Docs of >= 2 blocks: a dropped tail (< 1 block) cannot hide a whole doc or cut a doc's leading sentinel,
    # so each doc's membership can be read off the packed stream.
    assert min(lengths) >= 2 * block_size

    lm = build_lm_datasets(datasets.Dataset.from_list([{"text": d} for d in docs]), tokenizer, block_size=block_size)
    assert set(lm) == {"train", "eval"}
    eos = tokenizer.eos_token_id

    members = {}
    for name, split in lm.items():
        assert split.column_names == ["input_ids", "labels"]
        assert all(len(block) == block_size for block in split["input_ids"])
        assert split["labels"] == split["input_ids"]

        stream = packed_stream(split)
        decoded = tokenizer.decode(stream)
        members[name] = sorted(int(s[3:]) for s in SENTINEL.findall(decoded))
        assert members[name] == sorted(set(members[name]))  # each document once, in corpus order

        # The split's documents, in corpus order, each followed by eos: the packed stream is exactly its prefix,
        # and only the final remainder (fewer than block_size tokens) is missing.
        expected = []
        for i in members[name]:
            expected += tokenizer(docs[i], add_special_tokens=False)["input_ids"] + [eos]
        assert stream == expected[: len(stream)]
        assert 0 <= len(expected) - len(stream) < block_size
        assert stream.count(eos) == len(members[name]) - expected[len(stream) :].count(eos)
        assert (EOS_TOKEN.join(docs[i] for i in members[name]) + EOS_TOKEN).startswith(decoded)

    # Document-level split: disjoint, complete, with round(5% of 40) = 2 eval documents.
    assert not set(members["train"]) & set(members["eval"])
    assert sorted(members["train"] + members["eval"]) == list(range(len(docs)))
    assert len(members["eval"]) == 2

    stats = lm_dataset_stats(lm)
    assert stats["block_size"] == block_size
    assert stats["train_blocks"] == len(lm["train"]) and stats["train_tokens"] == len(lm["train"]) * block_size


def test_eval_split_size_follows_fraction_cap_and_seed(tokenizer):
    docs = datasets.Dataset.from_list([{"text": d} for d in sentinel_documents(40)])

    def eval_members(lm):
        return sorted(int(s[3:]) for s in SENTINEL.findall(tokenizer.decode(packed_stream(lm["eval"]))))

    quarter = build_lm_datasets(docs, tokenizer, block_size=16, eval_fraction=0.25)
    capped = build_lm_datasets(docs, tokenizer, block_size=16, eval_fraction=0.25, max_eval_documents=3)
    reseeded = build_lm_datasets(docs, tokenizer, block_size=16, eval_fraction=0.25, seed=7)
    assert len(eval_members(quarter)) == 10
    assert len(eval_members(capped)) == 3
    assert eval_members(reseeded) != eval_members(quarter)
    assert eval_members(build_lm_datasets(docs, tokenizer, block_size=16, eval_fraction=0.25)) == eval_members(quarter)


@pytest.mark.parametrize("num_proc", [None, 2])
def test_pack_is_exact_across_map_batches_and_processes(num_proc):
    # Documents from 1 to 40 tokens, packed 3 rows per map batch: blocks straddle batches (and the two shards).
    rows = [list(range(100 * i, 100 * i + 1 + (13 * i) % 40)) for i in range(30)]
    tokenized = datasets.Dataset.from_dict({"input_ids": rows, "num_tokens": [len(r) for r in rows]})
    stream = [t for r in rows for t in r]
    for block_size in (1, 7, 50):
        packed = data.packing._pack(
            tokenized, block_size, num_proc=num_proc, fingerprint=f"pack{block_size}", batch_size=3
        )
        num_blocks = len(stream) // block_size
        assert packed["input_ids"] == [stream[k * block_size : (k + 1) * block_size] for k in range(num_blocks)]


def test_cache_is_reused_and_keyed_by_block_size(tokenizer, tmp_path, monkeypatch):
    docs = datasets.Dataset.from_list([{"text": d} for d in sentinel_documents(30)])
    cache_dir = str(tmp_path / "cache")
    first = build_lm_datasets(docs, tokenizer, block_size=16, cache_dir=cache_dir)
    entries = glob.glob(os.path.join(cache_dir, "lm-*"))
    assert len(entries) == 1
    for split in first.values():
        assert all(f["filename"].startswith(entries[0] + os.sep) for f in split.cache_files)

    def no_tokenisation(*args, **kwargs):
        raise AssertionError("tokenised again")

    monkeypatch.setattr(data.packing, "_tokenize_and_pack", no_tokenisation)
    second = build_lm_datasets(docs, tokenizer, block_size=16, cache_dir=cache_dir)
    for name in ("train", "eval"):
        assert second[name]["input_ids"] == first[name]["input_ids"]
        assert second[name].cache_files == first[name].cache_files

    # A different block_size (or different texts) is a different entry: it must be built.
    with pytest.raises(AssertionError, match="tokenised again"):
        build_lm_datasets(docs, tokenizer, block_size=32, cache_dir=cache_dir)
    with pytest.raises(AssertionError, match="tokenised again"):
        build_lm_datasets(docs.select(range(20)), tokenizer, block_size=16, cache_dir=cache_dir)
    monkeypatch.undo()
    other = build_lm_datasets(docs, tokenizer, block_size=32, cache_dir=cache_dir)
    assert len(other["train"][0]["input_ids"]) == 32
    assert len(glob.glob(os.path.join(cache_dir, "lm-*"))) == 2
    assert not [n for n in os.listdir(cache_dir) if n.startswith(".tmp")]
    info = json.loads(open(os.path.join(entries[0], "adloco_lm_dataset.json")).read())
    assert info["block_size"] == 16 and info["train_blocks"] == len(first["train"])


def _distributed_worker(rank: int, port: int, tmp: str, texts: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    datasets.config.HF_DATASETS_CACHE = os.path.join(tmp, f"hf_datasets_{rank}")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        log = os.path.join(tmp, f"built_by_{rank}")
        real_train, real_build = data.tokenizer._train_byte_level_bpe, data.packing._tokenize_and_pack

        def train_and_log(*args, **kwargs):
            open(log, "a").write("tokenizer\n")
            return real_train(*args, **kwargs)

        def build_and_log(*args, **kwargs):
            open(log, "a").write("lm\n")
            return real_build(*args, **kwargs)

        data.tokenizer._train_byte_level_bpe, data.packing._tokenize_and_pack = train_and_log, build_and_log
        corpus = datasets.Dataset.from_list([{"text": t} for t in texts])
        cache_dir = os.path.join(tmp, "cache")
        tokenizer = load_or_train_tokenizer(None, corpus, vocab_size=300, cache_dir=cache_dir)
        lm = build_lm_datasets(corpus, tokenizer, block_size=16, cache_dir=cache_dir)
        with open(os.path.join(tmp, f"result_{rank}.json"), "w") as f:
            json.dump(
                {"files": [f["filename"] for f in lm["train"].cache_files], "train": list(lm["train"]["input_ids"])}, f
            )
    finally:
        dist.destroy_process_group()


def test_under_torch_distributed_only_rank_0_builds_and_the_others_load(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_distributed_worker, args=(port, str(tmp_path), sentinel_documents(30)), nprocs=2)
    assert open(tmp_path / "built_by_0").read().split() == ["tokenizer", "lm"]
    assert not (tmp_path / "built_by_1").exists()
    results = [json.loads((tmp_path / f"result_{rank}.json").read_text()) for rank in (0, 1)]
    assert results[0] == results[1] and results[0]["train"]
    assert all(f.startswith(str(tmp_path / "cache" / "lm-")) for f in results[1]["files"])


# ------------------------------------------------------------------------------------------------------------------
# Sources: C4 (offline, through local JSON lines) and local files
# ------------------------------------------------------------------------------------------------------------------


def test_c4_path_offline_takes_n_documents_and_feeds_packing(tmp_path, tokenizer):
    path = tmp_path / "c4-train.00000-of-01024.jsonl"
    docs = write_c4_jsonl(path, 30)

    c4 = load_c4(num_documents=12, data_files=str(path))
    assert c4.column_names == ["text"]
    assert c4["text"] == docs[:12]
    assert load_c4(num_documents=12, data_files=str(path))._fingerprint == c4._fingerprint  # cached, not re-streamed
    assert load_c4(num_documents=13, data_files=str(path))["text"] == docs[:13]
    for name in ("allenai/c4", "c4"):
        assert load_text_corpus(name, num_documents=12, data_files=[str(path)])["text"] == docs[:12]

    lm = build_lm_datasets(c4, tokenizer, block_size=16, eval_fraction=0.2)
    stats = lm_dataset_stats(lm)
    assert stats["train_blocks"] > 0 and stats["eval_blocks"] > 0
    seen = {int(s[3:]) for split in lm.values() for s in SENTINEL.findall(tokenizer.decode(packed_stream(split)))}
    assert seen == set(range(12))

    # An edited file is read again, not served from the cache of the old one.
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "x", "timestamp": "2019-04-01T00:00:00Z", "url": "u"}) + "\n")
    os.utime(path, ns=(1, 1))
    assert load_c4(num_documents=12, data_files=str(path))._fingerprint != c4._fingerprint


def test_load_text_corpus_reads_local_files_and_renames_the_text_column(tmp_path):
    jsonl = tmp_path / "notes.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "content": f"note number {i}"}) + "\n" for i in range(6)))
    for num_documents in (None, 4):
        corpus = load_text_corpus(str(jsonl), text_column="content", num_documents=num_documents)
        assert corpus.column_names == ["text"]
        assert corpus["text"] == [f"note number {i}" for i in range(num_documents or 6)]

    txt = tmp_path / "lines.txt"
    txt.write_text("first line\nsecond line\nthird line\n")
    assert load_text_corpus(str(txt))["text"] == ["first line", "second line", "third line"]
    assert load_text_corpus(str(tmp_path / "notes.jsonl"), text_column="content", num_documents=2)["text"] == [
        "note number 0",
        "note number 1",
    ]


# ------------------------------------------------------------------------------------------------------------------
# Errors name the field to fix
# ------------------------------------------------------------------------------------------------------------------


def test_c4_without_num_documents_is_an_error(tmp_path):
    path = tmp_path / "c4.jsonl"
    write_c4_jsonl(path, 3)
    with pytest.raises(ValueError, match="num_documents"):
        load_text_corpus("allenai/c4", data_files=str(path))


def test_missing_text_column_is_an_error(tmp_path, tokenizer):
    jsonl = tmp_path / "notes.jsonl"
    jsonl.write_text("".join(json.dumps({"content": f"note {i}"}) + "\n" for i in range(3)))
    for num_documents in (None, 2):
        with pytest.raises(ValueError, match="text_column='body'"):
            load_text_corpus(str(jsonl), text_column="body", num_documents=num_documents)
    with pytest.raises(ValueError, match="text_column"):
        load_c4(num_documents=2, data_files=str(jsonl))
    with pytest.raises(ValueError, match="'text'"):
        build_lm_datasets(datasets.Dataset.from_list([{"content": "a"}, {"content": "b"}]), tokenizer, block_size=4)


def test_corpus_too_small_is_an_error(tokenizer):
    tiny = datasets.Dataset.from_list([{"text": "a few words"}, {"text": "more words here"}, {"text": "end"}])
    with pytest.raises(ValueError, match="block_size=64"):
        build_lm_datasets(tiny, tokenizer, block_size=64)
    with pytest.raises(ValueError, match="at least 2 documents"):
        build_lm_datasets(tiny.select([0]), tokenizer, block_size=2)
    with pytest.raises(ValueError, match="eval_fraction"):
        build_lm_datasets(tiny, tokenizer, block_size=2, eval_fraction=1.0)
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(tiny, vocab_size=200, save_dir="unused")
