"""`make gpu-check` (`recipes/benchmarks/gpu_check/`): its steps' commands and the table from their outcomes, and
what it says without a GPU."""

import json

import pytest

from recipes.benchmarks import gpu_check


def test_gpu_check_table_from_the_steps_outcomes(tmp_path):
    assert gpu_check.pytest_counts("== 3 passed, 1 failed, 2 skipped, 1 error in 9.1s ==") == {
        "passed": 3, "failed": 1, "skipped": 2, "error": 1,
    }  # fmt: skip
    commands = gpu_check.step_commands(str(tmp_path))
    assert list(commands) == list(gpu_check.STEPS)
    assert "backend=nccl" in commands["1 worker, nccl, fp16, auto"]
    for folder, tokens_per_second in (("gloo4", 3000.0), ("gloo1", 1000.0), ("nccl1", 1500.0)):
        run = {"tokens_per_second": tokens_per_second, "final_eval_ppl": 90.0, "peak_memory_bytes": 2**30}
        run["max_batch_size"] = 48
        (tmp_path / folder).mkdir()
        results = {"methods": {"diloco": {"seed_results": {"7": run}}}}
        (tmp_path / folder / "results.json").write_text(json.dumps(results))
    outcomes = {
        "cuda tests": {"code": 1, "output": "1 passed, 1 failed in 3s"},
        "4 workers, gloo, fp16": {"code": 0, "output": ""},
        "1 worker, gloo, fp16": {"code": 0, "output": ""},
        "1 worker, nccl, fp16, auto": {"code": 0, "output": ""},
        "overhead": {"code": 1, "output": ""},
        "4 workers, gloo, fp16, comm": {"code": 1, "output": ""},
    }
    # The communication step: one method finished, the other did not.
    (tmp_path / "comm").mkdir()
    finished = {"tokens_per_second": 2500.0, "final_eval_ppl": 95.0}
    results = {"methods": {"adloco": {"seed_results": {"7": finished}}, "diloco_overlap_int4": {"seed_results": {}}}}
    (tmp_path / "comm" / "results.json").write_text(json.dumps(results))
    assert commands["4 workers, gloo, fp16, comm"][-4:-2] == list(gpu_check.COMM_METHODS)
    rows = {row["step"]: row for row in gpu_check.summarise(outcomes, str(tmp_path))}
    assert rows["comm: adloco"]["result"] == "2,500 tokens/s, ppl 95.0"
    assert rows["comm: diloco_overlap_int4"] == {
        "step": "comm: diloco_overlap_int4", "ok": "FAILED", "result": "no result (exit 1)",
    }  # fmt: skip
    assert rows["cuda tests"]["ok"] == "FAILED"
    assert rows["4 workers, gloo, fp16"]["ok"] == "ok" and "3,000 tokens/s" in rows["4 workers, gloo, fp16"]["result"]
    assert "auto -> 48" in rows["1 worker, nccl, fp16, auto"]["result"]
    assert rows["4 workers / 1 worker"]["result"] == "tokens/s x 3.00"
    assert rows["overhead"]["ok"] == "FAILED"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message given without a GPU")
def test_gpu_check_says_so_and_runs_nothing_without_cuda(tmp_path, capsys):
    assert gpu_check.main(["--output_dir", str(tmp_path / "g")]) == 2
    assert "no CUDA device" in capsys.readouterr().out and not (tmp_path / "g").exists()
