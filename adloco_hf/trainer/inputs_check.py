"""The first batch of the training (and evaluation) data, checked before training starts.

A dataset whose model input is in a column of another name (`tokens` instead of `input_ids`) loses that column to
the Trainer's `remove_unused_columns` (logged at INFO as "ignored"), and step 0 then fails inside the model with
"You must specify exactly one of input_ids or inputs_embeds", after every worker set up its round and the run's files
were created. [`check_first_batch`] builds one batch of a single sample the way the loader will (columns removed,
then the data collator) and raises, before anything is written, an error naming the columns found, the ones the
model takes, and the fixes.

A dataset of raw text (a `text` column of strings) would lose every column to `remove_unused_columns`, and the
Trainer's own error then advises `remove_unused_columns=False`, which is no fix: the model reads token ids.
[`check_not_text`] says to tokenise instead, before that.
"""

import contextlib
import inspect
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from transformers import Trainer

from ..common.upstream import trainer_collator_with_removed_columns, trainer_remove_unused_columns


__all__ = ["check_eval_batches", "check_eval_dataset", "check_first_batch", "check_not_text"]

# Parameters of a forward signature that are not inputs a dataset column could fill.
_NOT_COLUMNS = ("self", "args", "kwargs", "return_dict", "output_attentions", "output_hidden_states", "use_cache")


@contextlib.contextmanager
def _random_states_kept() -> Iterator[None]:
    """A collator may draw random numbers (masking, augmentation): the check must not move the run's generators."""
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(numpy)


def _columns(dataset: Any) -> list[str] | None:
    names = getattr(dataset, "column_names", None)
    if isinstance(names, list):
        return names
    with contextlib.suppress(Exception):
        with _random_states_kept():
            sample = dataset[0]
        return list(sample) if isinstance(sample, Mapping) else None
    return None


def _forward_inputs(trainer: Trainer) -> list[str]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "get_base_model"):  # PEFT: the base model's forward, as the Trainer reads it
        model = model.get_base_model()
    parameters = inspect.signature(model.forward).parameters
    return [name for name in parameters if name not in _NOT_COLUMNS]


def _owns_its_inputs(trainer: Trainer) -> bool:
    """A `compute_loss` of the user's (or a `compute_loss_func`) may read any key of the batch: nothing to check."""
    return getattr(trainer, "compute_loss_func", None) is not None or type(trainer).compute_loss is not (
        Trainer.compute_loss
    )


def _text_columns(dataset: Any, columns: list[str]) -> list[str]:
    """The columns of `dataset` that hold strings (from a `datasets` schema, else from its first sample)."""
    features = getattr(dataset, "features", None)
    if isinstance(features, Mapping):
        return [name for name in columns if getattr(features.get(name), "dtype", None) in ("string", "large_string")]
    with contextlib.suppress(Exception), _random_states_kept():
        sample = dataset[0]
        return [name for name in columns if isinstance(sample.get(name), str)]
    return []


def check_not_text(trainer: Trainer, dataset: Any, description: str = "training") -> None:
    """Raise `ValueError` for a dataset of text that the Trainer would strip of every column: no column the model
    takes, at least one of strings, `remove_unused_columns=True` (with it off, a collator may tokenise)."""
    if dataset is None or not trainer.args.remove_unused_columns or _owns_its_inputs(trainer):
        return
    columns = _columns(dataset)
    forward = _forward_inputs(trainer)
    if not columns or any(name in forward or name in trainer.label_names for name in columns):
        return
    text = _text_columns(dataset, columns)
    if not text:
        return
    model = trainer.accelerator.unwrap_model(trainer.model)
    main_input = getattr(model, "main_input_name", "input_ids")
    raise ValueError(
        f"AdLoCoTrainer: the {description} dataset holds text (column(s) {text} of strings), not the token ids "
        f"{type(model).__name__} takes ({main_input!r}). Tokenise it first: adloco_hf.data.build_lm_datasets(texts, "
        "tokenizer, block_size=128) packs a dataset of text into blocks of input_ids and labels (the README's "
        f"example), or dataset.map(lambda batch: tokenizer(batch[{text[0]!r}]), batched=True, "
        f"remove_columns={columns}) with data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False). "
        "(remove_unused_columns=False alone would hand the model strings.)"
    )


def check_first_batch(
    trainer: Trainer, dataset: Any, collate: Callable, *, original: Any, description: str = "training"
) -> None:
    """Collate `dataset[0]` with `collate` (what the loader will do) and raise `ValueError` if the batch lacks the
    model's main input (`model.main_input_name`, e.g. `input_ids`) and `inputs_embeds`.

    Args:
        dataset: the map-style dataset the loader reads (unused columns already removed, for a `datasets.Dataset`).
        collate: the loader's collate function (the data collator, wrapped to remove columns for other datasets).
        original: the dataset as given to the trainer, for the columns the message names.
        description: "training" or "evaluation", for the message.
    """
    model = trainer.accelerator.unwrap_model(trainer.model)
    main_input = getattr(model, "main_input_name", None)
    if main_input is None or _owns_its_inputs(trainer) or not hasattr(dataset, "__getitem__"):
        return
    with contextlib.suppress(TypeError):
        if len(dataset) == 0:
            return
    with _random_states_kept():
        batch = collate([dataset[0]])
    if not isinstance(batch, Mapping) or main_input in batch or "inputs_embeds" in batch:
        return
    forward = _forward_inputs(trainer)
    columns = _columns(original)
    name = type(model).__name__
    dropped = [c for c in columns or [] if c not in forward and c not in trainer.label_names]
    found = f"has the columns {columns}" if columns is not None else "has samples whose keys could not be read"
    removal = (
        f"; with remove_unused_columns=True the Trainer dropped {dropped}, which {name}.forward does not take"
        if trainer.args.remove_unused_columns and dropped
        else ""
    )
    rename = (
        f"dataset.rename_column({dropped[0]!r}, {main_input!r})"
        if len(dropped) == 1
        else f"dataset.rename_column('<your column>', {main_input!r})"
    )
    raise ValueError(
        f"AdLoCoTrainer: the first {description} batch has no {main_input!r}, the input {name} needs (or "
        f"'inputs_embeds'); it holds {sorted(batch)}. The {description} dataset {found}{removal} ({name}.forward "
        f"takes {', '.join(forward)}). Fix: name the model's input column {main_input!r} ({rename}), or set "
        f"remove_unused_columns=False and pass a data_collator that builds {main_input!r} from your columns."
    )


def check_eval_dataset(args, eval_dataset: Any) -> None:
    """Evaluation asked for (`eval_strategy`) needs an evaluation dataset, and one with samples: an empty one gave
    evaluation lines without a loss and a card without an evaluation section, and no word about it. Refused when the
    trainer is built, before training."""
    if args.eval_strategy == "no":
        return
    strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
    if eval_dataset is None:
        raise ValueError(
            f"eval_strategy={strategy!r} asks for evaluation but no eval_dataset was given; pass "
            "eval_dataset=... or set eval_strategy='no'"
        )
    for name, dataset in (eval_dataset if isinstance(eval_dataset, dict) else {None: eval_dataset}).items():
        with contextlib.suppress(TypeError):  # a stream has no length: its first evaluation shows what it holds
            if len(dataset) > 0:
                continue
            which = "eval_dataset" if name is None else f"eval_dataset[{name!r}]"
            raise ValueError(
                f"{which} has no samples, but eval_strategy={strategy!r} asks for evaluation: every evaluation would "
                "log no loss and the merged model's card no evaluation. Pass an evaluation set with samples (with "
                "build_lm_datasets: more documents, a larger eval_fraction or a smaller block_size), or set "
                "eval_strategy='no'."
            )


def check_eval_batches(trainer: Trainer) -> None:
    """The first batch of every map-style evaluation dataset, built as `Trainer.get_eval_dataloader` builds it
    (checked at the start of training, when evaluation is asked for: it would otherwise fail at the first
    evaluation, rounds into the run)."""
    import datasets

    if trainer.args.eval_strategy == "no" or trainer.eval_dataset is None:
        return
    evals = trainer.eval_dataset if isinstance(trainer.eval_dataset, dict) else {None: trainer.eval_dataset}
    for name, original in evals.items():
        if isinstance(original, torch.utils.data.IterableDataset):
            continue
        description = "evaluation" if name is None else f"evaluation ({name!r})"
        check_not_text(trainer, original, description)
        collator = trainer.data_collator
        if isinstance(original, datasets.Dataset):
            dataset = trainer_remove_unused_columns(trainer, original, "evaluation")
        else:
            dataset, collator = original, trainer_collator_with_removed_columns(trainer, collator, "evaluation")
        check_first_batch(trainer, dataset, collator, original=original, description=description)
