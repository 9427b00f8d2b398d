"""A wall-clock model: how long a run takes on a given device and link, and how long to a target perplexity.

A run's AdLoCo rounds file (`adloco_rounds.jsonl`, read with `adloco_hf.reporting.run_log`) says, per round and instance,
which workers trained, with which batch (and switch mode's plan: micro-batch and accumulation steps), for how many
inner steps, and which instances merged. Replayed here with

- a **device profile**: seconds of one forward/backward of b sequences (piecewise linear between the measured
  micro-batch sizes, linear beyond), of the optimizer step, of other per-step work and of an outer step's local
  work. Measured by `overhead --step_profile ...` (its `step_profile`), or given as JSON / on the command line.
  A step of a batch above the device's micro-batch limit runs as several micro-batches (switch mode's
  accumulation: the plan logged by the run, or `--device_max_micro_batch` for another device); the statistics step
  at a round's end runs as two halves when the run measured gradient statistics and did not accumulate;
- a **link**: bandwidth (bits/s) and latency (s) of every worker's own full-duplex link to a non-blocking switch.

Communication, modelled as the library sends it:

- ring all-reduce over M workers: 2 (M − 1) steps, each `latency + (payload / M) / bandwidth`, once per bucket
  (the outer step all-reduces in buckets of 2^25 elements; DDP's gradient buckets are 1 MiB, then 25 MiB).
  Instances all-reduce concurrently over disjoint workers, hence disjoint links: they do not slow each other down,
  and the round waits for the slowest instance;
- a merge: `plan_transfers` (adloco_hf.instances.transfers), the library's own message list: blocking point-to-point sends,
  each rank in the global order, each message `latency + bytes / bandwidth` per tensor (φ and the outer momentum in
  fp32; the inner AdamW state, two fp32 moments, to a worker that joins an instance); messages between disjoint
  pairs of ranks overlap, as they do with blocking sends;
- the final merge: each surviving instance's first worker sends φ (fp32) to rank 0 in turn, which broadcasts the
  result; the broadcast at the start (the initial weights, fp32, from rank 0): gloo's broadcast sends from the root
  to each rank over the root's link (`one_to_all`), NCCL's is pipelined (`pipelined`);
- control messages per round (the round-end barrier and the reports' all-gather): (W − 1) latencies each;
- DDP: one fp32 gradient all-reduce per step, after the backward (`--ddp_overlap 0`, the default) or overlapped
  with a fraction of the forward/backward time.

Per round: compute, communication and wall seconds; in total the same, and, given the run's eval curve (its
`result.json` from the benchmark worker, `toolkit/worker/`, or `--curve`), the time to reach each `--targets`
perplexity (tokens to the target interpolated on the curve in log-perplexity, then the time at those tokens within the
replay).

Validation (`--validate`) against `links`' runs over rate-limited links: per method and bandwidth, predicted
against measured wall seconds (and the seconds at which each run reached links' target perplexities, at the
measured tokens). The device profile must not come from the run being predicted: either a step profile measured
under the same CPU contention (`overhead --step_profile ... --step_profile_processes 4`: 4 processes with one
thread each on the 2 cores, as the 4 workers of a launch are; a profile from one process alone would be about twice
too fast), or `--calibrate highest`: each method's compute time scaled so that its run at the highest bandwidth
(communication small) is matched; that run is then reported as `calibration`, not as a prediction (a ValueError
when the predicted communication alone exceeds its measured wall time: no compute time can match it). The bytes
links counts on the wire include Ethernet/IP/TCP headers and ACKs: `--efficiency 0.95` (the payload share of a
tbf-limited veth link measured in DESIGN §9: 12.5 MB in 1.05 s at 100 Mbit/s) applies that to the bandwidth.

The 1B/H100 scenario (`--scenario 1b-h100`): time to target for DDP, DiLoCo and AdLoCo at 0.1 to 100 Gbit/s, with
every assumption printed and stored.

The package's modules: `replay` (step and round times, whole runs, time at tokens), `runs` (run folders on disk), `validate` (against links), `scenario` (1B/H100); the
command line is `python -m recipes.benchmarks.wallclock` (`__main__`, with examples). Links, device profiles and
message times are the toolkit's `link_model`, which the benchmarks' virtual clock prices with too.
"""

from recipes.benchmarks.toolkit.link_model import DeviceProfile, Link
from recipes.benchmarks.wallclock.replay import (
    RunFacts,
    replay_adloco,
    replay_ddp,
    seconds_at_tokens,
    time_to_targets,
    tokens_to_target,
)
from recipes.benchmarks.wallclock.runs import replay_folder, resolve_run_folder
from recipes.benchmarks.wallclock.scenario import Scenario, scenario_results


# What another benchmark replays runs with (`goodput_report`); the model's pieces are in the modules.
__all__ = [
    "DeviceProfile",
    "Link",
    "RunFacts",
    "Scenario",
    "replay_adloco",
    "replay_ddp",
    "replay_folder",
    "resolve_run_folder",
    "scenario_results",
    "seconds_at_tokens",
    "time_to_targets",
    "tokens_to_target",
]
