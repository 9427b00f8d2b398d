"""Tokenising and packing a document stream on the fly (`adloco_hf.data.packed_stream`): the blocks of the map-style
packing, an exact position with the carry, and an eval slice held out of training."""

import datasets
import pytest
import torch
from helpers import word_tokenizer, write_c4_shards

from adloco_hf.data import PackedStream, build_lm_stream, load_document_stream
from adloco_hf.data.packed_stream import PackedPart
from adloco_hf.data.packing import pack_documents


BLOCK = 16


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_c4_shards(tmp_path_factory.mktemp("shards"), 4, 10)


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


def blocks(part, n):
    return [part.next_example()["input_ids"] for _ in range(n)]


def sentinels(tokenizer, block_list):
    """The documents (sentinel words d<k>) that start inside the blocks."""
    words = tokenizer.convert_ids_to_tokens(torch.cat(block_list).tolist())
    return [word for word in words if word.startswith("d")]


def test_the_stream_packs_like_build_lm_datasets(shards, tokenizer):
    files, docs = shards
    reference = pack_documents(datasets.Dataset.from_dict({"text": docs}), tokenizer, block_size=BLOCK, name="train")
    part = PackedStream(load_document_stream("allenai/c4", data_files=files), tokenizer, block_size=BLOCK)
    part = part.split_by_node(0, 1)
    streamed = blocks(part, len(reference) + 3)  # past the end of the pass: the remainder carries into the next
    for block, row in zip(streamed, reference):
        assert block.dtype == torch.int64 and block.tolist() == row["input_ids"]
    example = PackedStream(load_document_stream("c4", data_files=files), tokenizer, block_size=BLOCK)
    first = example.split_by_node(0, 1).next_example()
    assert torch.equal(first["input_ids"], first["labels"]) and first["input_ids"] is not first["labels"]
    # Nothing dropped at the pass edge: the stream's tokens, twice over, are the blocks' tokens in order.
    tokens = sum((tokenizer(d, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for d in docs), [])
    assert torch.cat(streamed).tolist() == (tokens * 2)[: len(streamed) * BLOCK]


@pytest.mark.parametrize("world_size", [2, 6])
@pytest.mark.parametrize("stop", [0, 1, 5, 13, 30])
def test_stop_anywhere_and_resume_gives_the_uninterrupted_blocks(shards, tokenizer, world_size, stop):
    files, _ = shards
    documents = load_document_stream("allenai/c4", data_files=files)
    stream = PackedStream(documents, tokenizer, block_size=BLOCK, tokenize_documents=3)
    reference = blocks(stream.split_by_node(1, world_size), stop + 12)
    part = stream.split_by_node(1, world_size)
    blocks(part, stop)
    state = part.state_dict()
    assert state["kind"] == "packed" and state["carry"].dtype == torch.int32 and state["blocks"] == stop
    resumed = stream.split_by_node(1, world_size)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(blocks(resumed, 12), reference[stop:], strict=True))


def test_a_changed_block_size_or_tokenizer_is_refused(shards, tokenizer):
    files, _ = shards
    documents = load_document_stream("allenai/c4", data_files=files)
    part = PackedStream(documents, tokenizer, block_size=BLOCK).split_by_node(0, 2)
    blocks(part, 2)
    with pytest.raises(ValueError, match="another block_size \\(16, this run has 32\\)"):
        PackedStream(documents, tokenizer, block_size=32).split_by_node(0, 2).load_state_dict(part.state_dict())
    other = word_tokenizer(words=17)
    with pytest.raises(ValueError, match="another tokenizer"):
        PackedStream(documents, other, block_size=BLOCK).split_by_node(0, 2).load_state_dict(part.state_dict())


@pytest.mark.parametrize("world_size", [2, 3, 6])  # shards by file (even, uneven), stride
def test_eval_documents_are_held_out_of_every_worker_s_blocks(shards, tokenizer, world_size):
    files, docs = shards
    train, eval_blocks = build_lm_stream(
        load_document_stream("allenai/c4", data_files=files), tokenizer, block_size=BLOCK, eval_documents=4
    )
    assert eval_blocks.column_names == ["input_ids", "labels"] and len(eval_blocks) >= 1
    assert len(eval_blocks[0]["input_ids"]) == BLOCK
    held_out = {"d0", "d1", "d2", "d3"}
    assert set(sentinels(tokenizer, [torch.tensor(row["input_ids"]) for row in eval_blocks])) <= held_out
    seen = []
    for rank in range(world_size):
        part = train.split_by_node(rank, world_size)
        seen += sentinels(tokenizer, blocks(part, 12))
        seen += sentinels(tokenizer, [part.state_dict()["carry"].long()])
    assert not held_out & set(seen)
    assert {"d4", "d10", "d39"} <= set(seen)  # documents of every file reach training


def test_build_lm_stream_needs_documents_left_for_training(tmp_path, tokenizer):
    files, _ = write_c4_shards(tmp_path, 1, 3)
    with pytest.raises(ValueError, match="none would be left for training; lower eval_documents"):
        build_lm_stream(load_document_stream("c4", data_files=files), tokenizer, block_size=4, eval_documents=3)


def test_load_document_stream_keeps_text_only_one_shard_per_file(shards):
    files, _ = shards
    stream = load_document_stream("allenai/c4", data_files=sorted(files, reverse=True))
    assert stream.num_shards == 4 and list(next(iter(stream))) == ["text"]
    assert next(iter(stream))["text"].startswith("d0 ")  # sorted: the shards' own order
    with pytest.raises(FileNotFoundError, match="no file matches"):
        load_document_stream("allenai/c4", data_files=["missing-*.json"])
    with pytest.raises(ValueError, match="text_column='body' is not a column of"):
        load_document_stream(files[0], text_column="body")
    with pytest.raises(ValueError, match="is a built-in corpus, not a stream"):
        load_document_stream("builtin:python-docs")


def test_a_tokenizer_without_eos_is_refused(shards):
    files, _ = shards
    tokenizer = word_tokenizer()
    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="tokenizer has no eos_token"):
        PackedStream(load_document_stream("c4", data_files=files), tokenizer, block_size=BLOCK)


@pytest.mark.parametrize("old, new, draws", [(4, 2, [1, 4, 0, 9]), (2, 4, [3, 11]), (3, 2, [2, 0, 5])])
def test_a_re_split_packed_stream_trains_every_token_of_each_started_pass_once(shards, tokenizer, old, new, draws):
    files, docs = shards
    stream = PackedStream(load_document_stream("allenai/c4", data_files=files), tokenizer, block_size=BLOCK,
                          tokenize_documents=1)  # fmt: skip
    parts = [stream.split_by_node(rank, old) for rank in range(old)]
    emitted = [block for part, n in zip(parts, draws) for block in blocks(part, n)]
    states = PackedPart.reshard_states([part.state_dict() for part in parts], new)
    for rank, state in enumerate(states):  # old rank r's carry goes to new rank r % new, in old-rank order
        carries = [parts[r].state_dict()["carry"] for r in range(old) if r % new == rank]
        assert torch.equal(state["carry"], torch.cat(carries) if carries else torch.empty(0, dtype=torch.int32))
    last = max(state["source"]["epoch"] for state in states)
    for rank, state in enumerate(states):
        part = stream.split_by_node(rank, new)
        part.load_state_dict(state)
        mine = []
        while part.source.reading_pass <= last:  # the bridge: what the old workers left of passes 0..last
            mine.append(part.next_example()["input_ids"])
        # The last document read is the first of pass last + 1 under the new layout (the bridge may hold the same
        # document, of an earlier pass): its tokens are not the bridge's.
        tail = torch.cat([*mine, part.state_dict()["carry"].long()]).tolist()
        if mine:
            first_of_next = stream.split_by_node(rank, new).source.next_example()["text"].split()[0]
            cut = tokenizer.convert_tokens_to_ids(first_of_next)
            tail = tail[: len(tail) - 1 - tail[::-1].index(cut)]
        emitted.append(torch.tensor(tail, dtype=torch.long))
    trained = sorted(sentinels(tokenizer, emitted))
    assert trained == sorted([d.split()[0] for d in docs] * (last + 1))
