"""Run the demo (`make demo`) and write down what it did: docs/results/demo_run.json and .png, the README's lines.

    python -m recipes.benchmarks.demo_report                           # the demo (about 3 minutes), then the files
    python -m recipes.benchmarks.demo_report --from_run outputs/demo   # the files from a finished demo, no launch

The demo is launched exactly as `make demo` launches it (`DEMO_COMMAND`, into outputs/demo, which is replaced). The
results file holds the demo's config (recipes/configs/demo.yaml as read), the machine, the wall times, every round of
every instance and every evaluation, and the highlights the README quotes: how far the batch grew, when switch mode
capped and when it accumulated, the merges and what they did to the per-worker batch, the merged model's perplexity.
The README's paragraph between `README_BEGIN` and `README_END` is `render_markdown(results)`;
tests/docs/test_demo_run.py checks that the README holds exactly it and that the recorded config is demo.yaml's.

The modules: `results.py` (the results file from a run, its highlights), `markdown.py` (the README's paragraph),
`cli.py` (the launch, the files).
"""

from recipes.benchmarks.demo_report.cli import main, parse_args
from recipes.benchmarks.demo_report.markdown import (
    README_BEGIN,
    README_END,
    readme_section,
    render_markdown,
    replace_readme_section,
)
from recipes.benchmarks.demo_report.results import ACCELERATE_CONFIG, CONFIG, DEMO_COMMAND, PLOT, RESULTS, highlights


__all__ = [
    "ACCELERATE_CONFIG",
    "CONFIG",
    "DEMO_COMMAND",
    "PLOT",
    "README_BEGIN",
    "README_END",
    "RESULTS",
    "highlights",
    "main",
    "parse_args",
    "readme_section",
    "render_markdown",
    "replace_readme_section",
]
