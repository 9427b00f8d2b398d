"""Real slow links: DDP, DiLoCo and AdLoCo with every worker on its own machine behind a rate-limited link.

Each worker gets a Linux network namespace of its own (4 by default), joined to the others by a bridge that lives in
one more namespace; each worker's link (a veth pair: `lnkK` in the worker's namespace, `lnkKb` on the bridge) is
limited with `tc qdisc ... tbf` in both directions (egress of both ends). The addresses (`10.213.87.10 + K` by
default) exist only inside these namespaces. Every worker is launched as its own machine:

    ip netns exec adlk-wK python -m accelerate.commands.launch --multi_gpu --num_processes 4 --num_machines 4 \\
        --machine_rank K --main_process_ip 10.213.87.10 --main_process_port P ... \\
        --module recipes.benchmarks.toolkit.worker SPEC_JSON

with `GLOO_SOCKET_IFNAME=lnkK`, so torchrun's rendezvous and the whole gloo world run over the limited links (the
command is `adloco_hf.testing.launch_command`'s, one per machine: `toolkit/testbeds/machines.py`). The methods, their
settings and the worker are the toolkit's, as `convergence` runs them (`methods.py`, `settings.py`, `runs.prepare`,
`worker/`; every convergence option such as `--budget_tokens`, `--inner_steps` or `--set` is accepted here too).

Measured per bandwidth and method: the training wall time (evaluations excluded, from the worker's `result.json`),
the bytes through each link (the interfaces' own counters, `/sys/class/net/lnkK/statistics/{tx,rx}_bytes`, read
before and after the launch, per worker and in total; and cut to the training window from a timeline sampled every
0.25 s on the bridge side), the modelled bytes (the ring all-reduce model of `result.json`'s `comm_bytes`), the
tokens, the final eval perplexity, the eval curve over seconds and the seconds and tokens to reach target
perplexities that every method reaches (interpolated).

Per round ([`per_round`]; DDP: per step): the link bytes (training window, less the modelled start broadcast) and
the modelled bytes; the wall seconds (training window / rounds); and, for rounds 2 to R, the wall seconds of a
round against its compute-only seconds: the inner steps' time (from the Trainer's `on_step_begin` to `on_step_end`:
forward, backward, optimizer; the round's end, data loading and evaluations excluded), measured by the worker, the
slowest worker's; with the library's `comm_seconds` (the time the workers blocked in the outer step) beside them.
Also the training seconds until the eval perplexity first reaches diloco's final perplexity at the same bandwidth,
and for a variant (`diloco_int8`, `adloco_overlap` ...: `toolkit.methods.METHODS[name]["variant_of"]`) its bytes per
round, seconds per round, wall time and final perplexity against its base method's.

One check, one criterion: the training-window link bytes within 15 % of the modelled bytes including the start
broadcast, `comm_bytes + (M - 1) x 4 x parameters` (`toolkit.traffic.start_broadcast_bytes`: rank 0 sends its fp32
weights once to every other worker at the start, inside the training window; the ring model of `comm_bytes` leaves it
out; computed from first principles, not fitted). The ratios against `comm_bytes` alone (training window, whole
launch) are printed as diagnostics only. Every count includes Ethernet/IP/TCP headers and ACKs (about 4 %).

    # From the repository root, as root (namespaces); without them it prints "skipped: <why>" and exits 0.
    python -m recipes.benchmarks.links --quick        # 100 Mbit/s, ddp/diloco/adloco, small budget (< 10 minutes)
    python -m recipes.benchmarks.links                # 10mbit 100mbit 1gbit, same budget (~25 minutes)
    python -m recipes.benchmarks.links --bandwidth 50mbit 1gbit --methods ddp diloco --budget_tokens 204800
    # Machine 3 at a quarter of a core (a cgroup with a CPU quota), equal batches against a split by speed:
    python -m recipes.benchmarks.links --quick --methods diloco diloco_slow1 diloco_balanced
    # The pseudo-gradient's compression and the overlapped all-reduce at 10 Mbit/s, --quick's budget:
    python -m recipes.benchmarks.links --quick --bandwidth 10mbit \\
        --methods diloco diloco_int8 diloco_int4 diloco_overlap diloco_overlap_int4

Outputs in `--output_dir` (default `outputs/benchmarks/links`): `results.json`
(`{"bandwidths": {"100mbit": {"ddp": {"wall_seconds", "link_bytes", "model_bytes", "tokens", "final_eval_ppl",
"curve": [[seconds, tokens, eval_ppl], ...], "to_target", "world_size", "bandwidth_bits_per_second", "tbf",
"folder", "timings", ...}}}, "targets", "checks", "settings", "links", "machine"}`), `table.md` (also printed),
`links.png` (eval perplexity against training seconds, one panel per bandwidth), and per run the folder
`<bandwidth>/<method>/` with the spec, one launch log per machine, the worker's `result.json`, AdLoCo's run files
(`adloco_rounds.jsonl` ...) and `links.json` (the counters and their timeline).

Namespaces, links, bridge and qdiscs are removed on every exit (finally, SIGTERM, SIGINT, SIGHUP; further signals
are ignored while they are removed), and leftovers with the same names are removed before the start. The testbed
itself (`LinkPlan`, the `ip`/`tc` commands, `Testbed`, `Sampler`, `teardown`) is `toolkit/testbeds/testbed.py`, a run's
machines on it `toolkit/testbeds/machines.py`; this package keeps the records (`records.py`), the targets and the check
(`checks.py`), the report and the plot (`report.py`) and the command line (`cli.py`).
"""

from recipes.benchmarks.links.checks import add_reference_figures, add_targets, check_links
from recipes.benchmarks.links.cli import BUDGET_TOKENS, DEFAULT_METHODS, cleanup_line, main, parse_args
from recipes.benchmarks.links.records import (
    first_crossing,
    peak_rates,
    per_round,
    run_record,
    steady_rounds,
    window_bytes,
)
from recipes.benchmarks.links.report import format_report, plot


__all__ = [
    "BUDGET_TOKENS",
    "DEFAULT_METHODS",
    "add_reference_figures",
    "add_targets",
    "check_links",
    "cleanup_line",
    "first_crossing",
    "format_report",
    "main",
    "parse_args",
    "peak_rates",
    "per_round",
    "plot",
    "run_record",
    "steady_rounds",
    "window_bytes",
]
