"""`adloco_hf.reporting.run_log`: the run files written by `RunLog` and read back by `load_rounds` / `load_evals`."""

import json
import math

import pytest

from adloco_hf.reporting.run_log import (
    EVAL_FILE,
    MERGED,
    ROUNDS_FILE,
    RunLog,
    group_by_round,
    is_finite_number,
    load_evals,
    load_rounds,
)


def round_line(outer_step: int, instance: int, **extra) -> dict:
    return {"outer_step": outer_step, "global_step": 10 * outer_step, "instance": instance, **extra}


def eval_line(global_step: int, instance, loss: float) -> dict:
    return {"global_step": global_step, "outer_step": global_step // 10, "instance": instance, "eval_loss": loss}


def file_lines(path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_file_names(tmp_path):
    log = RunLog(str(tmp_path))
    assert (ROUNDS_FILE, EVAL_FILE) == ("adloco_rounds.jsonl", "adloco_eval.jsonl")
    assert log.rounds_path == str(tmp_path / "adloco_rounds.jsonl")
    assert log.eval_path == str(tmp_path / "adloco_eval.jsonl")


def test_fresh_start_empties_both_files(tmp_path):
    out = tmp_path / "run"  # not there yet: start creates it
    RunLog(str(out)).start(resumed_outer_step=None, resumed_global_step=None)
    assert (out / ROUNDS_FILE).read_text() == "" and (out / EVAL_FILE).read_text() == ""

    log = RunLog(str(out))
    log.write_rounds([round_line(1, 0), round_line(1, 1)])
    log.write_eval([eval_line(10, 0, 3.0)])
    assert len(file_lines(out / ROUNDS_FILE)) == 2 and len(file_lines(out / EVAL_FILE)) == 1

    RunLog(str(out)).start(resumed_outer_step=None, resumed_global_step=None)
    assert (out / ROUNDS_FILE).read_text() == "" and (out / EVAL_FILE).read_text() == ""
    assert sorted(p.name for p in out.iterdir()) == [EVAL_FILE, ROUNDS_FILE]  # no temporary file left behind


def test_resume_keeps_lines_up_to_the_checkpoint_and_drops_a_half_written_line(tmp_path):
    log = RunLog(str(tmp_path))
    log.start(resumed_outer_step=None, resumed_global_step=None)
    log.write_rounds([round_line(step, instance) for step in (1, 2, 3) for instance in (0, 1)])
    log.write_eval([eval_line(10, 0, 3.0), eval_line(20, 0, 2.5), eval_line(30, MERGED, 2.0)])
    # The interrupted run died while writing its next lines.
    with open(tmp_path / ROUNDS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(round_line(4, 0))[:25])
    with open(tmp_path / EVAL_FILE, "a", encoding="utf-8") as f:
        f.write('{"global_step": 4')

    RunLog(str(tmp_path)).start(resumed_outer_step=2, resumed_global_step=20)

    assert [(r["outer_step"], r["instance"]) for r in map(json.loads, file_lines(tmp_path / ROUNDS_FILE))] == [
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
    ]
    assert [e["global_step"] for e in map(json.loads, file_lines(tmp_path / EVAL_FILE))] == [10, 20]
    assert (tmp_path / ROUNDS_FILE).read_text().endswith("}\n")

    # The resumed run appends after what it kept.
    log.write_rounds([round_line(3, 0)])
    assert [r["outer_step"] for r in load_rounds(tmp_path)] == [1, 1, 2, 2, 3]


def test_resume_from_the_final_checkpoint_drops_the_merged_models_evaluation(tmp_path):
    # Killed after the merged model's evaluation (in the push, say): the resumed run evaluates it again, once.
    log = RunLog(str(tmp_path))
    log.start(resumed_outer_step=None, resumed_global_step=None)
    log.write_eval([eval_line(20, 0, 2.5), eval_line(30, 0, 2.2), eval_line(30, MERGED, 2.0)])
    RunLog(str(tmp_path)).start(resumed_outer_step=3, resumed_global_step=30)
    assert [(e["global_step"], e["instance"]) for e in load_evals(tmp_path)] == [(20, 0), (30, 0)]


def test_resume_keeps_a_complete_last_line_without_newline(tmp_path):
    (tmp_path / ROUNDS_FILE).write_text(json.dumps(round_line(1, 0)) + "\n" + json.dumps(round_line(2, 0)))
    log = RunLog(str(tmp_path))
    log.start(resumed_outer_step=5, resumed_global_step=50)
    log.write_rounds([round_line(3, 0)])
    assert [r["outer_step"] for r in load_rounds(tmp_path)] == [1, 2, 3]
    assert (tmp_path / EVAL_FILE).read_text() == ""  # missing on resume: created empty


def test_non_finite_numbers_become_null(tmp_path):
    log = RunLog(str(tmp_path))
    log.start(resumed_outer_step=None, resumed_global_step=None)
    log.write_rounds(
        [
            round_line(
                1,
                0,
                train_loss=float("nan"),
                grad_variance=float("inf"),
                grad_sq_norm=-float("inf"),
                pseudo_grad_norm=0.5,
                extra={"a": float("nan"), "b": [1.0, float("inf")]},
                workers=(0, 1),
            )
        ]
    )
    text = (tmp_path / ROUNDS_FILE).read_text()
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} written"))  # strict JSON
    [record] = load_rounds(tmp_path)
    assert record["train_loss"] is None and record["grad_variance"] is None and record["grad_sq_norm"] is None
    assert record["pseudo_grad_norm"] == 0.5
    assert record["extra"] == {"a": None, "b": [1.0, None]}
    assert record["workers"] == [0, 1]


def test_load_reads_back_what_was_written(tmp_path):
    rounds = [
        round_line(step, instance, batch_size=2**step, workers=[instance], train_loss=5.0 - step, merged_from=[])
        for step in (1, 2)
        for instance in (0, 1)
    ]
    evals = [eval_line(10, 0, 3.0), eval_line(10, 1, 3.5), eval_line(20, MERGED, 2.5)]
    log = RunLog(str(tmp_path))
    log.start(resumed_outer_step=None, resumed_global_step=None)
    log.write_rounds(rounds[:2])
    log.write_eval(evals[:2])
    log.write_rounds(rounds[2:])
    log.write_eval(evals[2:])

    assert load_rounds(tmp_path) == rounds
    assert load_evals(tmp_path) == evals
    assert load_evals(tmp_path)[-1]["instance"] == "merged"


def test_load_sorts_and_reports_damage(tmp_path):
    lines = [round_line(2, 1), round_line(1, 1), round_line(2, 0), round_line(1, 0)]
    (tmp_path / ROUNDS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [(r["outer_step"], r["instance"]) for r in load_rounds(tmp_path)] == [(1, 0), (1, 1), (2, 0), (2, 1)]

    (tmp_path / EVAL_FILE).write_text(json.dumps(eval_line(20, 0, 2.0)) + "\n" + json.dumps(eval_line(10, 0, 3.0)))
    assert [e["global_step"] for e in load_evals(tmp_path)] == [10, 20]

    (tmp_path / ROUNDS_FILE).write_text(json.dumps(round_line(1, 0)) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"adloco_rounds.jsonl:2: expected a JSON object, got list"):
        load_rounds(tmp_path)

    (tmp_path / ROUNDS_FILE).write_text(json.dumps(round_line(1, 0)) + '\n{"outer_st')
    with pytest.warns(UserWarning, match=r"adloco_rounds.jsonl:2: skipping a truncated last line"):
        assert len(load_rounds(tmp_path)) == 1


def test_group_by_round_and_is_finite_number():
    rounds = [round_line(1, 0), round_line(1, 1), round_line(3, 0), round_line(2, 0)]
    grouped = group_by_round(rounds)
    assert list(grouped) == [1, 2, 3]
    assert [r["instance"] for r in grouped[1]] == [0, 1]

    assert is_finite_number(0) and is_finite_number(-2.5) and is_finite_number(10**30)
    for value in (None, True, False, "1.0", math.nan, math.inf, -math.inf, [1.0]):
        assert not is_finite_number(value), value
