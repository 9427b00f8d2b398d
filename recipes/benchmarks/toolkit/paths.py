"""Where the benchmarks run and write, and the offline environment they run in.

Every benchmark runs from the repository root (`REPO`) and launches its workers from there, with it on PYTHONPATH.
The results data that the guides quote lives under `docs/results/` (`RESULTS`), apart from the guides.
"""

import os


__all__ = ["OFFLINE", "REPO", "RESULTS", "offline"]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RESULTS = os.path.join(REPO, "docs", "results")
# Nothing a benchmark runs needs the network: the built-in corpus, a tokenizer trained on it, models from presets.
OFFLINE = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def offline() -> None:
    """Set `OFFLINE` where the environment does not say otherwise. Call it before anything imports huggingface_hub,
    which reads these once."""
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
