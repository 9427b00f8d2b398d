"""The soak's run: 4 workers of the fault run (`toolkit/worker/fault_run.py`), its config and model, and how many
steps make its minutes."""

__all__ = [
    "CONFIG",
    "MODEL",
    "START_SECONDS",
    "STEP_SECONDS",
    "WORLD_SIZE",
    "run_config",
    "spec",
    "steps_for",
]

WORLD_SIZE = 4
CONFIG = dict(
    inner_steps=10, save_steps=50, save_total_limit=3, num_instances=2, per_device_train_batch_size=2,
    max_batch_size=4, batch_size_cap=4, eta=0.5, seed=3, optim="adamw_torch", learning_rate=3e-3,
    lr_batch_scaling="sqrt", worker_timeout=10,
)  # fmt: skip
# A Llama of ~2.4 M parameters (`tiny_llama`'s default size takes 20 ms a step: 45,000 steps in 15 minutes).
MODEL = {"hidden_size": 256, "layers": 4}
# Seconds per inner step of this config on 2 shared CPU cores (4 workers, rounds and merges included), and the
# seconds before the first step (4 processes importing torch and transformers): measured to size `--minutes`.
STEP_SECONDS = 0.12
START_SECONDS = 11.0


def run_config(max_steps: int, save_steps: int) -> dict:
    """CONFIG for `max_steps` and `save_steps`: the 2 instances merge halfway (`merge_every` rounds)."""
    rounds = max_steps // CONFIG["inner_steps"]
    return {**CONFIG, "max_steps": max_steps, "save_steps": save_steps, "merge_every": max(1, rounds // 2)}


def steps_for(minutes: float, save_steps: int) -> int:
    """The `max_steps` that trains about `minutes` (a multiple of `save_steps`, at least 3 checkpoint intervals)."""
    return max(3 * save_steps, round(minutes * 60 / STEP_SECONDS / save_steps) * save_steps)


def spec(out: str, probe: str, config: dict) -> dict:
    """The fault run's spec (`toolkit/worker/fault_run.py`): resume automatically, record progress."""
    # Fresh data: each worker draws at most batch_size_cap samples per step, so no sample repeats.
    return {
        "output_dir": out,
        "world_size": WORLD_SIZE,
        "probe_dir": probe,
        "config": config,
        "dropout": 0.1,
        "model": MODEL,
        "resume": "auto",
        "progress": True,
        "num_samples": config["max_steps"] * config["batch_size_cap"] * WORLD_SIZE,
    }
