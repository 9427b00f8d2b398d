"""The tokenizer of a run: a pretrained one, or a byte-level BPE trained on the corpus and cached; fingerprints."""

import hashlib
import json
import logging
import os
import tempfile

import datasets
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from ..common.files import publish_files
from ..common.upstream import fingerprint as dataset_fingerprint
from ..common.upstream import tokenizer_encodes_in_its_backend
from .cache import FORMAT_VERSION, MAP_BATCH_SIZE, content_hash, main_process_first
from .python_source import TOKENIZER_SAMPLE_COLUMN
from .sources import require_text_column


logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"

_TOKENIZER_FINGERPRINT_FILE = "adloco_tokenizer.json"


def train_tokenizer(texts: datasets.Dataset, *, vocab_size: int, save_dir: str) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts["text"]`, save it to `save_dir`, or reuse the one saved there.

    GPT-2's recipe with the `tokenizers` library: ByteLevel pre-tokenizer and decoder (every byte is in the vocabulary,
    so any text round-trips and there are no unknown tokens) and one special token, `"<|endoftext|>"`, used as
    bos/eos/unk/pad. A corpus with a boolean `"tokenizer_sample"` column (`builtin:python-source`) is learnt from the
    rows where it is true only. No special token is added when encoding; [`build_lm_datasets`] appends the eos after each
    document. `save_dir` also receives `adloco_tokenizer.json`, a fingerprint of `texts` and `vocab_size`: when it
    matches, the saved tokenizer is loaded instead of trained again. Files are written to a temporary directory and
    moved into `save_dir` one by one with `os.replace`, the fingerprint last, so a reader never sees a half-written
    tokenizer; other files in `save_dir` are left alone. Under `torch.distributed`, global rank 0 trains and the
    other ranks load its result. Training logs one INFO line; a reuse, a DEBUG one.

    Args:
        texts: documents, column `"text"`.
        vocab_size: size of the vocabulary, special token included (> 257: the 256 bytes and `"<|endoftext|>"`).
        save_dir: where the tokenizer is saved (`save_pretrained`) and looked for.

    Returns:
        The tokenizer, as loaded from `save_dir` (the same object a later call returns).
    """
    if vocab_size <= 257:
        raise ValueError(f"vocab_size must be > 257 (256 bytes + {EOS_TOKEN!r}), got {vocab_size}")
    require_text_column(texts)
    fingerprint = _tokenizer_training_fingerprint(texts, vocab_size)
    with main_process_first():
        if _saved_fingerprint(save_dir) == fingerprint:
            # DEBUG: a hit of the whole cache is one line, `build_lm_datasets`' (which names the tokenizer)
            logger.debug("tokenizer: reusing %s (trained on the same corpus, vocab_size=%d)", save_dir, vocab_size)
        else:
            logger.info("tokenizer: training a byte-level BPE of %d tokens into %s", vocab_size, save_dir)
            tokenizer = _train_byte_level_bpe(texts, vocab_size)
            os.makedirs(save_dir, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=save_dir, prefix=".tmp-tokenizer-") as tmp:
                tokenizer.save_pretrained(tmp)
                info = {"fingerprint": fingerprint, "vocab_size": vocab_size, "num_documents": len(texts)}
                with open(os.path.join(tmp, _TOKENIZER_FINGERPRINT_FILE), "w") as f:
                    json.dump(info, f, indent=2)
                publish_files(tmp, save_dir, last=_TOKENIZER_FINGERPRINT_FILE)
    return AutoTokenizer.from_pretrained(save_dir)


def load_or_train_tokenizer(
    tokenizer_name_or_path: str | None, texts: datasets.Dataset, *, vocab_size: int, cache_dir: str
) -> PreTrainedTokenizerBase:
    """The tokenizer of a run: a pretrained one, or a byte-level BPE trained on the corpus and cached.

    Args:
        tokenizer_name_or_path: a local path or Hub id for `AutoTokenizer.from_pretrained`; `None` trains one with
            [`train_tokenizer`] into `cache_dir/tokenizer-<fingerprint of texts and vocab_size>`.
        texts: documents, column `"text"` (only used for training).
        vocab_size: vocabulary size of a trained tokenizer (ignored for a pretrained one).
        cache_dir: where trained tokenizers are kept.

    Returns:
        The tokenizer, with `pad_token` set (to the eos token when it had none).
    """
    if tokenizer_name_or_path is None:
        fingerprint = _tokenizer_training_fingerprint(texts, vocab_size)
        save_dir = os.path.join(cache_dir, f"tokenizer-{fingerprint}")
        return train_tokenizer(texts, vocab_size=vocab_size, save_dir=save_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name_or_path)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"Tokenizer {tokenizer_name_or_path!r} has neither a pad_token nor an eos_token; packing needs an "
                "eos_token between documents: set tokenizer_name_or_path to a tokenizer that has one"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _train_byte_level_bpe(texts: datasets.Dataset, vocab_size: int) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if TOKENIZER_SAMPLE_COLUMN in texts.column_names:  # the corpus names the documents to learn from
        texts = texts.select(np.flatnonzero(np.asarray(texts.with_format(None)[TOKENIZER_SAMPLE_COLUMN], dtype=bool)))
    texts = texts.select_columns(["text"])
    batches = (texts[i : i + MAP_BATCH_SIZE]["text"] for i in range(0, len(texts), MAP_BATCH_SIZE))
    tokenizer.train_from_iterator(batches, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,  # the default would rewrite " ." to "." and break round trips
    )


def _tokenizer_training_fingerprint(texts: datasets.Dataset, vocab_size: int) -> str:
    return content_hash(["tokenizer", FORMAT_VERSION, dataset_fingerprint(texts), vocab_size])


def _saved_fingerprint(save_dir: str) -> str | None:
    try:
        with open(os.path.join(save_dir, _TOKENIZER_FINGERPRINT_FILE)) as f:
            return json.load(f).get("fingerprint")
    except (OSError, ValueError):
        return None


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Identity of a tokenizer for the packing cache: what its files define (the full definition, its size and eos),
    never the name or path it was loaded by, so the same tokenizer reached as `cache/tokenizer-x`, `./cache/...`, an
    absolute path or a copy keys one cache entry. The backend's truncation and padding, which a call may have set and
    packing does not use, are left out."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = json.loads(backend.to_str())
        definition.pop("truncation", None)
        definition.pop("padding", None)
        definition = json.dumps(definition, sort_keys=True)
    else:  # a slow tokenizer: the vocabulary (with BPE merges where it has them) is what it is made of
        merges = getattr(tokenizer, "bpe_ranks", None)
        merges = sorted((" ".join(pair), rank) for pair, rank in merges.items()) if merges else None
        definition = json.dumps([sorted(tokenizer.get_vocab().items()), merges])
    return content_hash(
        [len(tokenizer), tokenizer.eos_token_id, hashlib.sha256(definition.encode("utf-8")).hexdigest()]
    )


def document_token_ids(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """Each text's token ids, without special tokens: `tokenizer(texts, add_special_tokens=False)["input_ids"]`.

    A fast tokenizer whose encoding is its backend's alone (no truncation or padding set, no `_encode_plus` of its
    own) is called through `encode_batch_fast`, which skips the character offsets the Trainer's call computes: the same
    ids in about half the time (tokenising `builtin:python-source`, 31 M tokens, is most of a first demo's start).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    plain = (
        tokenizer_encodes_in_its_backend(tokenizer)
        and hasattr(backend, "encode_batch_fast")
        and backend.truncation is None
        and backend.padding is None
        and backend.encode_special_tokens == bool(getattr(tokenizer, "split_special_tokens", False))
    )
    if plain:
        return [encoding.ids for encoding in backend.encode_batch_fast(texts, add_special_tokens=False)]
    return tokenizer(texts, add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]
