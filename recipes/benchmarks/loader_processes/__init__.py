"""Tokens/s of a tiny AdLoCo run with 0 and with N DataLoader worker processes, side by side (issue 38).

One process (one AdLoCo worker), a 2-layer Llama, the built-in corpus packed into Arrow blocks (map-style) or packed on
the fly from JSON-lines shards (a `PackedStream`). Runs alternate between the settings (0, N, N, 0, 0, N, ...) so
that a busy machine slows both alike; each run's tokens/s is timed from the first step of its second round to its
last step's end (the loader processes' start and the first round's end stay out). Writes one JSON file; the ratio of
a repeat is its two runs' tokens/s, with over without.

    python -m recipes.benchmarks.loader_processes --repeats 6 --out docs/results/loader_processes_cpu.json
"""

from recipes.benchmarks.loader_processes.cli import main, parse_args


__all__ = ["main", "parse_args"]
