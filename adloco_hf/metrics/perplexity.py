"""Token-weighted perplexity from per-batch mean losses, as an `evaluate` metric that loads offline.

`evaluate.load("perplexity")` fetches a module from the Hub that runs a model itself; this one only aggregates
numbers a training loop already has: the mean cross-entropy of each evaluation batch and the number of tokens it
was averaged over. Load it by path (the file ships with the package, no network needed):

```python
>>> import os, evaluate, adloco_hf
>>> path = os.path.join(os.path.dirname(adloco_hf.__file__), "metrics", "perplexity.py")
>>> metric = evaluate.load(path)
>>> metric.compute(losses=[2.0, 1.0], num_tokens=[100, 300])
{'perplexity': 3.4903429574618414, 'loss': 1.25}
```
"""

import math

import datasets
import evaluate


_DESCRIPTION = """
Perplexity of a causal language model from per-batch losses: exp(Σ_b n_b·loss_b / Σ_b n_b), where loss_b is the mean
cross-entropy (natural log) over the n_b predicted tokens of batch b. Weighting by tokens makes the result independent
of how the evaluation set was cut into batches.
"""

_KWARGS_DESCRIPTION = """
Args:
    losses (`list[float]`): mean cross-entropy loss (nats per token) of each batch.
    num_tokens (`list[int]`): number of tokens each loss was averaged over (> 0).
Returns:
    perplexity (`float`): exp(loss), `inf` when the loss overflows.
    loss (`float`): the token-weighted mean loss.
Examples:
    >>> metric.compute(losses=[2.0, 1.0], num_tokens=[100, 300])
    {'perplexity': 3.4903429574618414, 'loss': 1.25}
"""

_CITATION = """
@misc{kutuzov2025adloco,
  title={AdLoCo: adaptive batching significantly improves communications efficiency and convergence for Large
         Language Models},
  author={Kutuzov, Nikolay and Makarov, Makar and Rogozin, Alexander and Gasnikov, Alexander},
  year={2025},
  eprint={2508.18182},
  archivePrefix={arXiv},
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Perplexity(evaluate.Metric):
    """Token-weighted perplexity from `losses` (per-batch mean cross-entropy) and `num_tokens` (see the module)."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"losses": datasets.Value("float64"), "num_tokens": datasets.Value("int64")}),
            reference_urls=["https://arxiv.org/abs/2508.18182"],
        )

    def _compute(self, losses: list[float], num_tokens: list[int]) -> dict[str, float]:
        if not losses:
            raise ValueError("perplexity needs at least one batch: losses and num_tokens are empty")
        if any(n <= 0 for n in num_tokens):
            raise ValueError(f"num_tokens must all be > 0, got {list(num_tokens)}")
        total = sum(num_tokens)
        loss = sum(float(value) * n for value, n in zip(losses, num_tokens)) / total
        return {"perplexity": math.exp(loss) if loss < 700 else math.inf, "loss": loss}
