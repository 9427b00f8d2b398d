"""`adloco_hf.reporting.report`: the number formats and the summary of a tiny run written with `RunLog`."""

import json
import math
import subprocess
import sys

import pytest

from adloco_hf.common.formats import byte_unit, format_bytes, format_count, format_duration
from adloco_hf.reporting.report import format_summary, instance_label, summarize_run
from adloco_hf.reporting.run_log import MERGED, RunLog


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (0.5, "0.5 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (10 * 1024, "10 KiB"),
        (10.5 * 1024, "10 KiB"),  # no decimal from 10 on (banker's rounding of 10.5)
        (123.6 * 1024, "124 KiB"),
        (7_769_856, "7.4 MiB"),
        (2**20 - 1, "1 MiB"),  # 1023.999 KiB rounds to the next unit, not to "1024 KiB"
        (1023.7, "1 KiB"),
        (5 * 2**30, "5 GiB"),
        (3 * 2**40, "3 TiB"),
        (2**50, "1024 TiB"),  # TiB is the largest unit
        (-1536, "-1.5 KiB"),
        (float("nan"), "nan B"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_byte_unit_agrees_with_format_bytes():
    assert byte_unit(0) == (1, "B")
    assert byte_unit(3_000_000) == (2**20, "MiB")
    assert byte_unit(2**20 - 1) == (2**20, "MiB")
    assert byte_unit(2**45) == (2**40, "TiB")
    for n in (5, 2000, 3 * 10**6, 7 * 10**9, 2**40 + 1):
        scale, unit = byte_unit(n)
        assert format_bytes(n).endswith(" " + unit)
        assert 1 <= n / scale < 1024


def test_format_count_and_duration():
    assert [format_count(n) for n in (0, 42, 999, 1000, 2000, 1_234_567, 999_999, 12_000_000, 3.2e12)] == [
        "0",
        "42",
        "999",
        "1K",
        "2K",
        "1.2M",
        "1M",
        "12M",
        "3.2T",
    ]
    assert [format_duration(s) for s in (0, 5, 59.6, 125, 3600, 3725)] == [
        "0s",
        "5s",
        "1m 00s",
        "2m 05s",
        "1h 00m 00s",
        "1h 02m 05s",
    ]
    assert instance_label(3) == "instance 3" and instance_label(MERGED) == "merged model"


def tiny_run(output_dir) -> None:
    """3 rounds: instances 0 (workers 0, 1) and 1 (worker 2); 1 merges into 0 after round 2. Written as the trainer does."""
    log = RunLog(str(output_dir))
    log.start(resumed_outer_step=None, resumed_global_step=None)
    batch = {0: 2, 1: 4}
    workers = {0: [0, 1], 1: [2]}
    total = 0
    for step in (1, 2, 3):
        lines = []
        for instance in sorted(workers):
            samples = 5 * batch[instance] * len(workers[instance])
            total += 16 * samples
            lines.append(
                {
                    "outer_step": step,
                    "global_step": 5 * step,
                    "instance": instance,
                    "workers": workers[instance],
                    "batch_size": batch[instance],
                    "next_batch_size": 2 * batch[instance],
                    "samples": samples,
                    "tokens": 16 * samples,
                    "train_loss": float("nan") if (step, instance) == (2, 1) else 4.0 - step + instance,
                    "comm_bytes": 3 * 2**20 if len(workers[instance]) > 1 else 0,
                    "comm_seconds": 0.25,
                    "merged_from": [1] if (step, instance) == (2, 0) else [],
                    "elapsed_seconds": 40.0 * step,
                    "skipped": (step, instance) == (2, 1),
                }
            )
        if step == 2:
            workers[0] += workers.pop(1)
            batch.pop(1)
        for line in lines:
            line["num_instances"] = len(workers)
            line["total_tokens"] = total
        for instance in batch:
            batch[instance] *= 2
        log.write_rounds(lines)
        if step == 2:
            log.write_eval([{"global_step": 10, "instance": 0, "eval_loss": 2.0}])
            log.write_eval([{"global_step": 10, "instance": 1, "eval_loss": 1.5, "eval_perplexity": math.exp(1.5)}])
    log.write_eval([{"global_step": 15, "instance": MERGED, "eval_loss": 1.75, "eval_perplexity": math.exp(1.75)}])


def test_summarize_run(tmp_path):
    tiny_run(tmp_path)
    summary = summarize_run(tmp_path)
    tokens = 16 * 5 * ((2 * 2 + 4) + (4 * 2 + 8) + 8 * 3)
    assert summary == {
        "output_dir": str(tmp_path),
        "rounds": 3,
        "global_step": 15,
        "initial_instances": 2,
        "final_instances": 1,
        "batch_size_start": {0: 2, 1: 4},
        "batch_size_end": {0: 8, 1: 8},
        "batch_size_next": {0: 16},
        "merges": 1,
        "merge_events": [{"outer_step": 2, "survivor": 0, "merged_from": [1]}],
        "total_tokens": tokens,
        "total_samples": tokens // 16,
        "comm_bytes": 3 * 3 * 2**20,
        "comm_seconds": 5 * 0.25,
        "final_train_loss": 1.0,
        "final_eval_perplexity": pytest.approx(math.exp(1.75)),
        "final_eval_instance": MERGED,
        "best_eval_perplexity": pytest.approx(math.exp(1.5)),
        "best_eval_instance": 1,
        "best_eval_step": 10,
        "wall_seconds": 120.0,
        "skipped_rounds": 1,
    }
    json.dumps(summary)


def test_format_summary(tmp_path):
    tiny_run(tmp_path)
    text = format_summary(summarize_run(tmp_path))
    assert text.splitlines() == [
        f"AdLoCo run: {tmp_path}",
        "  rounds                 3 (global step 15)",
        "  instances              2 -> 1 (1 merged away)",
        "  batch size per worker  instance 0: 2 -> 8 (next round's request: 16)",
        "                         instance 1: 4 -> 8  (merged into 0 at round 2)",
        "  tokens seen            3.8K (240 samples)",
        "  communicated           9 MiB in 1.2 s",
        "  final train loss       1.0000",
        "  eval perplexity        final 5.75 (merged model), best 4.48 (instance 1, step 10)",
        "  wall time              2m 00s",
        "  skipped rounds         1",
    ]


def test_report_does_not_import_matplotlib():
    code = "import sys, adloco_hf.reporting.report; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
