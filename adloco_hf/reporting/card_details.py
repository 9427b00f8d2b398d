"""What a model card says about where a model comes from: the data, the model training started from, the batch that
ran. A card names a Hub repo only where one is known (a Hub id, or a folder of the Hub's cache), never a local path in
its metadata, and a dataset only when it was given (`datasets` names local files "json", and built ones "generator").
"""

import os
import re
from dataclasses import dataclass, field
from typing import Any


__all__ = [
    "CardDetails",
    "ModelKind",
    "batch_used",
    "describe_model",
    "hub_dataset_id",
    "hub_model_id",
    "last_round_batches",
]

# The Auto class and Hub task of a model, found from its class (the first mapping that lists it wins).
_TASKS = (
    ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "text-generation"),
    ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "text2text-generation"),
    ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "fill-mask"),
    ("AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "text-classification"),
    ("AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "token-classification"),
    ("AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "question-answering"),
)
# A Hub repo id: `name` or `owner/name` (letters, digits, `-`, `_`, `.`).
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
# A model folder of the Hub's cache: `.../models--owner--name/snapshots/<commit>`.
_CACHED_MODEL = re.compile(r"(?:^|[\\/])models--([\w.-]+?)(?:--([\w.-]+))?[\\/]snapshots[\\/][0-9a-f]+[\\/]?$")


@dataclass
class CardDetails:
    """What the trainer cannot find out about a run, for the cards of its folders (`trainer.card_details`).

    Set it before the cards are written (the merges' during training, `merged/`'s at its end), or call
    `trainer.write_merged_cards()` after changing it.

    Attributes:
        dataset: the data trained on: a Hub dataset id (`"roneneldan/TinyStories"`, then also the card's `datasets`
            metadata and the dataset of its `model-index`), or local files or a corpus, named in the card's text.
        metrics_before: the starting model's evaluation on the same eval set (`{"perplexity": 41.2, "loss": 3.7}`),
            shown beside the final one: what fine-tuning changed.
    """

    dataset: str | None = None
    metrics_before: dict[str, float] = field(default_factory=dict)


def hub_model_id(name_or_path: str | None) -> tuple[str | None, str | None]:
    """(Hub id, local folder) of the name a model was loaded by: a name that is no local path is a Hub id; a folder of
    the Hub's cache gives the id it holds; any other local folder gives no id."""
    if not name_or_path:
        return None, None
    if not os.path.exists(name_or_path):
        return (name_or_path, None) if _REPO_ID.match(name_or_path) else (None, None)
    cached = _CACHED_MODEL.search(os.path.abspath(name_or_path))
    repo = None if cached is None else "/".join(part for part in cached.groups() if part)
    return repo, os.path.abspath(name_or_path)


@dataclass(frozen=True)
class ModelKind:
    """How a folder loads: its Auto class and Hub task, and the model training started from (for a PEFT adapter, the
    model it applies to): its Hub id when known, else the local folder it was loaded from."""

    auto_class: str = "AutoModelForCausalLM"
    pipeline_tag: str | None = "text-generation"
    adapter: bool = False  # a PEFT adapter folder (adapter_config.json), not a full model
    base_model: str | None = None  # a Hub id
    base_path: str | None = None  # a local folder (named in a card on disk only, never in one pushed to the Hub)


def describe_model(model) -> ModelKind:
    """The [`ModelKind`] of a (possibly PEFT-wrapped) model."""
    from transformers.models.auto import modeling_auto

    adapter = hasattr(model, "peft_config") and hasattr(model, "get_base_model")
    inner = model.get_base_model() if adapter else model
    auto_class, pipeline_tag = "AutoModel", None
    for name, mapping, task in _TASKS:
        classes = {c for v in getattr(modeling_auto, mapping).values() for c in (v if isinstance(v, tuple) else (v,))}
        if type(inner).__name__ in classes:
            auto_class, pipeline_tag = name, task
            break
    if adapter:
        config = model.peft_config.get(getattr(model, "active_adapter", "default"))
        base = getattr(config, "base_model_name_or_path", None)
    else:  # what from_pretrained loaded (a model built in code has none)
        base = getattr(getattr(model, "config", None), "_name_or_path", None)
    repo, path = hub_model_id(base)
    return ModelKind(auto_class, pipeline_tag, adapter, repo, path)


def hub_dataset_id(dataset: str | None) -> str | None:
    """`dataset` when it is a Hub dataset id (not a local path, not a built-in corpus such as `builtin:python-docs`)."""
    if not dataset or os.path.exists(dataset) or not _REPO_ID.match(dataset):
        return None
    return dataset


def batch_used(record: dict[str, Any]) -> int:
    """Samples each worker of an instance used per inner step in a round, from its rounds-file line: the request, or
    `max_batch_size` where switch mode capped it (`RoundLine.batch_size_used`, written since 0.3; computed from the
    plan's keys for older files, and the request for a line without them)."""
    if record.get("batch_size_used") is not None:
        return record["batch_size_used"]
    if "accumulation_steps" not in record:
        return record["batch_size"]
    if record["accumulation_steps"] > 1:
        return record["batch_size"]
    return record.get("processes_per_worker", 1) * record["micro_batch_size"]


def last_round_batches(rounds: list[dict[str, Any]]) -> dict[int, str]:
    """Instance id → the per-worker batch that ran in the last round, with its micro-batches when accumulated
    (`"24 (3 micro-batches of 8)"`), from `load_rounds`' records."""
    if not rounds:
        return {}
    last = max(record["outer_step"] for record in rounds)
    batches = {}
    for record in rounds:
        if record["outer_step"] != last:
            continue
        used, steps, micro = batch_used(record), record["accumulation_steps"], record["micro_batch_size"]
        processes = record.get("processes_per_worker", 1)
        text = str(used)
        if steps > 1:
            at_most = "at most " if micro * steps * processes != used else ""
            text += f" ({steps} micro-batches of {at_most}{micro}{' per process' if processes > 1 else ''})"
        batches[record["instance"]] = text
    return batches
