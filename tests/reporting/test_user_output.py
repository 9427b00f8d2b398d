"""What a user sees while training on one worker: the round's log line, warnings, and the progress bar's estimate."""

import logging

import pytest
import torch
from helpers import sequence_dataset, tiny_model, tiny_run_config
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback
from transformers.utils import logging as hf_logging

from adloco_hf import AdLoCoTrainer


def config(tmp_path, **kwargs):
    return tiny_run_config(tmp_path, **({"per_device_train_batch_size": 2} | kwargs))


@pytest.fixture
def records(records):
    """What reaches the handlers of the `transformers` logger (where the Trainer's own lines print); the test's
    changes of verbosity are undone."""
    verbosity = hf_logging.get_verbosity()
    yield records
    hf_logging.set_verbosity(verbosity)


def round_lines(caplog):
    return [r for r in caplog.records if r.name.startswith("adloco_hf") and r.getMessage().startswith("round ")]


@pytest.mark.parametrize(("log_level", "shown"), [("info", True), ("warning", False)])
@pytest.mark.parametrize("disable_tqdm", [True, False])
def test_one_line_per_round_whatever_the_log_level(tmp_path, records, capsys, log_level, shown, disable_tqdm):
    """The round's line is logged at INFO like the Trainer's lines; where that level does not show, the console
    callback (the progress bar's, or the printer's with `disable_tqdm`) prints it instead of the round's `adloco/*`
    dict, which reaches `report_to` only. The Trainer's banner keeps its true lines."""
    args = config(tmp_path, log_level=log_level, disable_tqdm=disable_tqdm)
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(64))
    trainer.train()
    lines = round_lines(records)
    assert len(lines) == (2 if shown else 0), [r.getMessage() for r in records.records]
    assert all(r.levelno == logging.INFO for r in lines)
    assert lines[0].getMessage().startswith("round 1 (step 6) | instances 1 | batch i0=") if shown else True
    console = capsys.readouterr()
    printed = [line for line in (console.out + console.err).splitlines() if "round " in line and "(step " in line]
    assert len(printed) == (0 if shown else 2), console
    assert "adloco/" not in console.out + console.err
    assert [entry["adloco/round"] for entry in trainer.state.log_history if "adloco/round" in entry] == [1, 2]
    banner = [r.getMessage() for r in records.records if r.name == "transformers.trainer"]
    if shown:
        assert "  Total optimization steps = 12" in banner and not any("Num Epochs" in line for line in banner)
        start = next(r.getMessage() for r in records.records if r.getMessage().startswith("AdLoCo: "))
        assert start.startswith("AdLoCo: 1 worker, 1 instance, max_steps 12 in 2 rounds of 6 inner steps"), start


class PoisonAt(TrainerCallback):
    """Turns the weights NaN at the start of one step: the round it belongs to is skipped."""

    def __init__(self, step: int):
        self.step = step

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))


def test_a_skipped_round_logs_a_warning_even_at_the_default_level(tmp_path, records):
    args = config(tmp_path)  # log_level="passive": warnings only
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(64), callbacks=[PoisonAt(8)])
    trainer.train()
    lines = round_lines(records)
    assert [r.levelno for r in lines] == [logging.WARNING], [r.getMessage() for r in records.records]
    assert (
        lines[0].getMessage().startswith("round 2 (step 12)") and "SKIPPED (non-finite) [0]" in lines[0].getMessage()
    )


class VirtualClock:
    """The progress bar's clock, in which each inner step takes 20 ms per sample: steps of a grown batch are slower,
    as on a real device, and the speeds are exact whatever else the machine is doing."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SlowerWithTheBatch(AdLoCoTrainer):
    clock = VirtualClock()

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.clock.now += 0.02 * inputs["input_ids"].shape[0]
        return super().training_step(model, inputs, num_items_in_batch)


class WatchTheBar(TrainerCallback):
    """Added after the Trainer's ProgressCallback: sees the bar right after it moved, at the end of every step."""

    def __init__(self, trainer):
        self.trainer, self.seen = trainer, {}

    def bar(self):
        return next(c for c in self.trainer.callback_handler.callbacks if isinstance(c, ProgressCallback)).training_bar

    def on_train_begin(self, args, state, control, **kwargs):
        bar = self.bar()
        bar._time = self.trainer.clock
        bar.start_t = bar.last_print_t = self.trainer.clock()
        bar.mininterval = 0  # refresh (and measure) at every step

    def on_step_end(self, args, state, control, **kwargs):
        bar = self.bar()
        self.seen[state.global_step] = (bar.format_dict["rate"], bar._ema_dt.calls)


def test_the_progress_estimate_restarts_when_a_round_changes_the_batch(tmp_path):
    args = config(
        tmp_path, max_steps=8, inner_steps=4, eta=0.2, batch_size_cap=12, disable_tqdm=False, logging_strategy="no"
    )
    trainer = SlowerWithTheBatch(model=tiny_model(), args=args, train_dataset=sequence_dataset(256))
    watch = WatchTheBar(trainer)
    trainer.add_callback(watch)
    trainer.train()
    assert trainer.adloco_state.batch_sizes[0] == 12  # the first round grew the request 2 → 12: 8 per step (capped)
    assert watch.seen[3][0] == pytest.approx(1 / 0.04)  # 2 samples per step: 40 ms per step
    # The round ended at step 4 with a new batch: the bar's speed estimate restarted there...
    assert watch.seen[4][1] == 0 and watch.seen[5][1] == 1
    # ...so it is the speed of the new, slower steps (8 samples, 160 ms), not a blend with the fast ones before.
    assert watch.seen[6][0] == pytest.approx(1 / 0.16)
