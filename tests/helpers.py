"""Shared pieces of the test suite: tiny models built from configs, learnable synthetic data, launching workers.

Launching, the tiny models and their arithmetic sequences come from `adloco_hf.testing` (shared with the
benchmarks); what is only the tests' (the contract keys, the other synthetic data) lives here.
"""

import atexit
import dataclasses
import importlib
import json
import os
import re
import tempfile
import time
import types

import huggingface_hub
import torch
import warm_launch

import adloco_hf.data
import adloco_hf.presets
from adloco_hf import AdLoCoConfig, testing
from adloco_hf.common.clock import Clock
from adloco_hf.rounds.rules import RoundRules, RoundSettings
from adloco_hf.testing import WorkersResult, free_port, launch_command, run_workers, sequence_dataset
from adloco_hf.testing import tiny_llama as tiny_model
from adloco_hf.testing import tiny_llama_config as tiny_config
from recipes.benchmarks.toolkit.resumed_runs import RESUMED_ROUND_KEYS


__all__ = [
    "COMPARED_ROUND_KEYS",
    "CONTRACT_ROUND_KEYS",
    "PAPER_ROUNDS",
    "REPO",
    "RESUME_CONFIG",
    "SCRIPTS",
    "StepClock",
    "start_worker",
    "TESTS",
    "TINY_TRAINING",
    "TWO_BY_TWO",
    "c4_documents",
    "comparable_rounds",
    "flat_params",
    "free_port",
    "hub_http",
    "launch",
    "launch_failing",
    "run_launch",
    "assert_no_worker_killed_by_launcher",
    "launch_run",
    "merged_params",
    "root_cause",
    "reports_of",
    "round_rules",
    "rounds_of",
    "sequence_dataset",
    "tiny_config",
    "tiny_model",
    "tiny_run_config",
    "word_tokenizer",
    "worker_spec",
    "write_c4_shards",
]


# DESIGN §4's keys of adloco_rounds.jsonl, written out here on purpose: a contract test must not read the list it checks.
CONTRACT_ROUND_KEYS = frozenset(
    {
        "outer_step", "global_step", "instance", "workers", "num_instances", "batch_size", "next_batch_size",
        "micro_batch_size", "accumulation_steps", "samples", "train_loss", "grad_variance", "grad_sq_norm",
        "pseudo_grad_norm", "comm_bytes", "comm_seconds", "merged_from",
    }
)  # fmt: skip

# The rounds-file keys that a resumed run must reproduce exactly (timings and bytes of the wire may differ).
COMPARED_ROUND_KEYS = RESUMED_ROUND_KEYS

# The resume tests' run (2 workers): 2 instances merging at round 4 (after the checkpoint at step 10), norm-test
# batches that grow, and a learning rate that follows each worker's batch (so the workers' schedules differ when the
# checkpoint is taken). With `dropout` 0.1 a resume must restore every worker's random generators too.
RESUME_CONFIG = dict(
    max_steps=30, inner_steps=5, save_steps=10, num_instances=2, merge_every=4, per_device_train_batch_size=2,
    max_batch_size=4, eta=0.5, seed=3, optim="adamw_torch", learning_rate=3e-3, lr_batch_scaling="sqrt",
    batch_size_target="test",  # NORM_TEST below
)  # fmt: skip

# The norm test's own requests (`batch_size_target="test"`) instead of the default goodput rule, for the tests whose
# subject is not the rule: the rule's decisions follow the step times the run measures, so two runs of one seed
# (a resumed one and an uninterrupted one, DDP and FSDP) may choose different requests; the norm test's repeat
# exactly. The default and the rule's own runs are tested in tests/config/test_config.py and
# tests/worker/test_goodput_runs.py (there with a deterministic `StepClock`, resumes included).
NORM_TEST = {"batch_size_target": "test"}

# Two workers of two processes (DDP or FSDP inside each worker; `two_by_two_ddp` in conftest.py, test_worker_fsdp.py):
# outer_lr 1, no momentum and float32 for the exact-mean checks; a norm test that measures (grad_variance) but, with
# eta 1e6, never grows the batch, so DDP and FSDP take the same decisions whatever the float order of their
# reductions, and their runs can be compared number for number.
TWO_BY_TWO = dict(
    seed=3, optim="adamw_torch", learning_rate=3e-3, per_device_train_batch_size=2, max_batch_size=4, eta=1e6,
    processes_per_worker=2, max_steps=12, inner_steps=4, outer_lr=1.0, outer_momentum=0.0,
    pseudo_grad_dtype="float32", save_strategy="no", **NORM_TEST,
)  # fmt: skip

# The Trainer's settings of the one-process tests' short runs (`tiny_run_config`); a plain `Trainer` compared with
# such a run takes them too.
TINY_TRAINING = dict(
    max_steps=12, per_device_train_batch_size=4, learning_rate=1e-2, optim="adamw_torch", use_cpu=True, report_to=[],
    save_strategy="no", disable_tqdm=True, seed=7,
)  # fmt: skip

# The HTTP library whose errors the installed huggingface_hub raises (the Hub tests fake its failures with them):
# httpx2 from huggingface_hub 2.0 (which transformers allows from 5.18), httpx before.
hub_http = importlib.import_module("httpx2" if int(huggingface_hub.__version__.split(".")[0]) >= 2 else "httpx")

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
SCRIPTS = os.path.join(TESTS, "scripts")


# The paper's round end where the config's defaults differ: one round's gradient statistics, a non-positive estimate
# of ‖∇F‖² clamped at 0, and a merged instance that keeps its per-worker request.
PAPER_ROUNDS = {"batch_size_smoothing": 0.0, "nonpositive_signal": "clamp", "merge_batch_rule": "paper"}


def round_rules(*, max_batch_size: int, shard_size: int | None = None, **settings) -> RoundRules:
    """`RoundRules` as a run builds them (`RoundRules.from_args`), from `AdLoCoConfig`'s defaults overridden by
    `settings` (its field names), without the config's checks: a test of the decision needs no output_dir."""
    defaults = {f.name: f.default for f in dataclasses.fields(AdLoCoConfig) if f.default is not dataclasses.MISSING}
    defaults.update(NORM_TEST)  # the decision tests' requests are the norm test's unless they name a target
    unknown = sorted(set(settings) - set(defaults))
    if unknown:
        raise TypeError(f"round_rules: {unknown} are not AdLoCoConfig fields")
    args = types.SimpleNamespace(**{**defaults, **settings})
    return RoundRules.from_args(
        args, settings=RoundSettings.from_args(args), max_batch_size=max_batch_size, shard_size=shard_size
    )


def tiny_run_config(tmp_path, **overrides) -> AdLoCoConfig:
    """A one-process CPU run of `TINY_TRAINING` into `tmp_path/out`: rounds of 6 inner steps, micro-batches of at
    most 8, the norm test's requests (`NORM_TEST`); `overrides` (any `AdLoCoConfig` field) replace these."""
    base = dict(TINY_TRAINING, output_dir=str(tmp_path / "out"), inner_steps=6, max_batch_size=8, **NORM_TEST)
    return AdLoCoConfig(**(base | overrides))


def c4_documents(num_documents: int, *, first: int = 0, words: int = 16) -> list[str]:
    """Documents of 2 to 14 words: a sentinel `d<k>` (so a test can tell which documents a block holds), then words
    `w<j>` of a small vocabulary in a pattern that depends on k."""
    docs = []
    for k in range(first, first + num_documents):
        docs.append(" ".join([f"d{k}"] + [f"w{(k * 7 + j * 3) % words}" for j in range(1 + (k * 5) % 13)]))
    return docs


def write_c4_shards(directory, num_shards: int, docs_per_shard: int) -> tuple[list[str], list[str]]:
    """JSON-lines shards in C4's schema (`text`, `timestamp`, `url`), named as C4's are; returns (files, documents)
    with the documents in shard order (`c4_documents`, sentinels d0, d1, ...)."""
    os.makedirs(directory, exist_ok=True)
    files, docs = [], []
    for shard in range(num_shards):
        path = os.path.join(str(directory), f"c4-train.{shard:05d}-of-{num_shards:05d}.json")
        texts = c4_documents(docs_per_shard, first=shard * docs_per_shard)
        with open(path, "w", encoding="utf-8") as f:
            for i, text in enumerate(texts):
                f.write(json.dumps({"text": text, "timestamp": "2019-04-01T12:00:00Z", "url": f"https://e.org/{i}"}))
                f.write("\n")
        files.append(path)
        docs.extend(texts)
    return files, docs


def word_tokenizer(num_documents: int = 1000, words: int = 16):
    """A fast word-level tokenizer for `c4_documents`: one token per word (`d<k>` for k < num_documents, `w<j>`),
    `</s>` as eos. Built in milliseconds, the same on every worker."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    names = ["[UNK]", "</s>"] + [f"w{j}" for j in range(words)] + [f"d{k}" for k in range(num_documents)]
    backend = Tokenizer(WordLevel({name: i for i, name in enumerate(names)}, unk_token="[UNK]"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="[UNK]", pad_token="</s>")


class StepClock(Clock):
    """A deterministic clock for the step timings of `batch_size_target="goodput"` (installed as `Worker.clock`, the
    library's hook, `common/clock.py`): a forward/backward pass of n samples takes `per_pass + per_sample × n`
    seconds, the rest of a step `per_step`, an outer step `per_round` (a list: round k's outer step takes item
    k mod its length, so that the averages depend on their history), the startup profile's all-reduce of b bytes
    per worker among M a ring of 2 (M − 1) steps of `per_hop` + b / M × `per_byte`. A run timed by it takes the same
    decisions every time, so a resumed run can be compared with an uninterrupted one."""

    def __init__(self, per_step=0.005, per_pass=0.01, per_sample=0.002, per_round=0.5, per_hop=1e-3, per_byte=1e-7):
        super().__init__()
        self.per_step, self.per_pass, self.per_sample, self.per_round = per_step, per_pass, per_sample, per_round
        self.per_hop, self.per_byte = per_hop, per_byte
        self.seconds = 0.0
        self.merges: list[list] = []

    def now(self) -> float:
        return self.seconds

    def passes(self, chunk_sizes) -> None:
        self.seconds += sum(self.per_pass + self.per_sample * n for n in chunk_sizes)

    def step_rest(self) -> None:
        self.seconds += self.per_step

    def outer_step(self, *, round_number, workers, payload_bytes) -> None:
        cycle = self.per_round if isinstance(self.per_round, list) else [self.per_round]
        self.seconds += cycle[(round_number - 1) % len(cycle)]

    def all_reduce(self, *, workers, payload_bytes) -> None:
        self.seconds += 2 * (workers - 1) * (self.per_hop + payload_bytes / workers * self.per_byte)

    def merge(self, *, round_number, sent_bytes) -> None:
        self.merges.append([round_number, list(sent_bytes)])  # what the worker announced (`Clock.merge`)

    def install(self, trainer) -> None:
        """Time `trainer`'s worker with this clock."""
        trainer.worker.clock = self


def start_worker(trainer) -> None:
    """Start `trainer`'s worker as `train()` would (its optimizer, scheduler and sampler made first), without running
    the training loop: a test can then run single inner steps through `trainer.training_step`."""
    args = trainer.args
    trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
    trainer.get_train_dataloader()
    trainer.worker.start(
        model=trainer.model,
        optimizer=trainer.optimizer,
        lr_scheduler=trainer.lr_scheduler,
        sampler=trainer.train_sampler,
        scaler=None,
        max_steps=args.max_steps,
        global_step=0,
        probe_step=trainer.run_probe_step,
    )


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters() if p.requires_grad])


# Seconds torchrun waits, after a signal to the launcher (e.g. SIGTERM, forwarded to every worker), before it kills the
# workers (`TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, 30 s by default): longer here, so that no test depends on how fast a loaded
# machine stops, saves and exits. (After a worker fails, torchrun SIGTERMs the others and kills them 30 s later
# whatever this says; `launch_failing` checks that none had to be killed.)
SHUTDOWN_SECONDS = "120"
_KILLED_BY_LAUNCHER = "forcefully exiting via 9"  # torchrun: "Unable to shutdown process N via 15, forcefully ..."


def _launch_env(env: dict | None) -> dict:
    return {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": SHUTDOWN_SECONDS, **(env or {})}


def run_launch(
    command: list[str],
    *,
    timeout: int = 300,
    env: dict | None = None,
    check: bool = True,
    warm: bool = False,
    zygote: "warm_launch.Zygote | None" = None,
) -> WorkersResult:
    """Run a launcher's command line (`launch_command`'s, or torchrun's own) as every test launch runs: from the
    repository root with it and `tests/` on `PYTHONPATH` (worker scripts import `helpers`), one OpenMP thread each,
    and `SHUTDOWN_SECONDS` for torchrun. With `check`, a failed launch fails the test with the workers' output.

    `warm`: the same launcher and command line, run by the session's launch server (`warm_launch.py`: the launcher
    and its workers are forked with the library imported, about 4 s less per launch on 2 cores), unless
    `ADLOCO_TEST_LAUNCH=cold` asks every launch to start from scratch. `zygote`: another launch server than the
    session's (`new_zygote`)."""
    env = _launch_env(env)
    if not warm or os.environ.get("ADLOCO_TEST_LAUNCH") == "cold":
        return run_workers(
            command, timeout=timeout, env=env, cwd=REPO, pythonpath=[REPO, TESTS], threads=1, check=check
        )
    assert command[1] == "-m" and command[2] in warm_launch.LAUNCHERS, command
    full_env = testing._worker_env(env, pythonpath=[REPO, TESTS], threads=1)
    with tempfile.NamedTemporaryFile("r", suffix=".log", prefix="launch-", encoding="utf-8", errors="replace") as log:
        start = time.perf_counter()
        returncode, timed_out = (zygote or _zygote()).launch(
            command[2:], env=full_env, cwd=REPO, log=log.name, timeout=timeout, kill_grace=testing.KILL_GRACE_SECONDS
        )
        result = WorkersResult(
            command=tuple(command),
            returncode=testing.TIMEOUT_EXIT_CODE if timed_out else returncode,
            stdout=log.read(),
            stderr="",
            seconds=time.perf_counter() - start,
            timed_out=timed_out,
        )
    if check and not result.ok:
        raise testing.WorkersFailed(result)
    return result


_ZYGOTE: list = []


def new_zygote() -> "warm_launch.Zygote":
    """A launch server as the session's (`close()` it when done)."""
    return warm_launch.Zygote(testing._worker_env(_launch_env(None), pythonpath=[REPO, TESTS]), REPO)


def _zygote() -> "warm_launch.Zygote":
    """The test session's launch server, started at the first warm launch (again if it died), stopped at exit."""
    if not _ZYGOTE or not _ZYGOTE[0].alive():
        _ZYGOTE[:] = [new_zygote()]
        atexit.register(_ZYGOTE[0].close)
    return _ZYGOTE[0]


def assert_no_worker_killed_by_launcher(output: str) -> None:
    """Once a worker has failed, the launcher's SIGTERM must end the others (a worker waiting on the failed one stops
    waiting, a survivor inside a round leaves, a deliberately hung test worker dies on it): none is left for SIGKILL."""
    assert _KILLED_BY_LAUNCHER not in output, f"a worker ignored the launcher's SIGTERM:\n{output[-6000:]}"


def launch(
    script: str, *args: str, num_processes: int, timeout: int = 300, env: dict | None = None, warm: bool = True
) -> WorkersResult:
    """`accelerate launch --multi_gpu` with gloo on CPU (DESIGN §6); fails the test with the workers' output
    (`run_launch`). `warm`: through the test session's launch server (`warm_launch.py`; False for a test of start-up,
    of a launcher's own behaviour, or of descriptors a dying launcher leaves)."""
    command = launch_command(script, *args, num_processes=num_processes)
    return run_launch(command, timeout=timeout, env=env, warm=warm)


def launch_failing(
    script: str, *args: str, num_processes: int, timeout: int = 300, env: dict | None = None, warm: bool = True
) -> str:
    """A launch that must fail (a worker the test kills, hangs or breaks): returns the whole output.

    Fails the test when the launch succeeded, ran past `timeout`, or failed on an `AssertionError` in a worker: the
    scripts' own checks (the world size every worker asserts, the probes) are never the failure a test provokes.
    """
    command = launch_command(script, *args, num_processes=num_processes)
    result = run_launch(command, timeout=timeout, env=env, check=False, warm=warm)
    output = result.stdout + result.stderr
    assert not result.timed_out, f"workers did not finish in {result.seconds:.0f}s:\n{output[-4000:]}"
    assert result.returncode != 0, f"the launch was expected to fail but succeeded:\n{output[-4000:]}"
    assert "AssertionError" not in output, f"a worker's own check failed:\n{output[-6000:]}"
    assert_no_worker_killed_by_launcher(output)
    return output


def root_cause(output: str) -> tuple[int, int]:
    """(rank, exit code) of the worker torchrun's summary blames ("Root Cause (first observed failure)")."""
    found = re.search(
        r"Root Cause \(first observed failure\):\s*\[0\]:.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", output, re.S
    )
    assert found, output[-3000:]
    return int(found.group(1)), int(found.group(2))


def comparable_rounds(out: str, keys=COMPARED_ROUND_KEYS) -> list[dict]:
    """A run's rounds file reduced to `keys`: what an interrupted and resumed run must reproduce exactly."""
    return [{k: line[k] for k in keys} for line in rounds_of(out)]


def worker_spec(out: str, probe, world_size: int, config: dict, **extra) -> dict:
    """The spec of `scripts/adloco_worker.py` (and the scripts built on it): output and probe folders, the world size
    every worker asserts, AdLoCoConfig overrides (`output_dir` added) and the script's own keys."""
    return {
        "output_dir": out,
        "world_size": world_size,
        "probe_dir": str(probe),
        "config": {"output_dir": out, **config},
        **extra,
    }


def reports_of(probe, world_size: int) -> list[dict]:
    """The `report-rank{R}.json` every worker of `scripts/adloco_worker.py` wrote into `probe`."""
    return [json.load(open(os.path.join(str(probe), f"report-rank{r}.json"))) for r in range(world_size)]


def rounds_of(out: str) -> list[dict]:
    """The lines of a run's `adloco_rounds.jsonl`."""
    with open(os.path.join(out, "adloco_rounds.jsonl")) as f:
        return [json.loads(line) for line in f]


def merged_params(out: str) -> torch.Tensor:
    """The trainable parameters of a run's `merged/` model, flat (loaded as a user would, `from_pretrained`)."""
    from transformers import AutoModelForCausalLM

    return flat_params(AutoModelForCausalLM.from_pretrained(os.path.join(out, "merged")))


def launch_run(
    script: str, tmp_path, config: dict, *, world_size: int, name: str = "out", timeout: int = 400, **extra
):
    """Launch `script` on `world_size` processes with `worker_spec` into `tmp_path/name` (probes in
    `tmp_path/probe-name`); returns (output folder, probe folder)."""
    out, probe = str(tmp_path / name), tmp_path / f"probe-{name}"
    spec = worker_spec(out, probe, world_size, config, **extra)
    launch(script, json.dumps(spec), num_processes=world_size, timeout=timeout)
    return out, probe


# What builds a run's data and model, by (module, name): a test that replaces each proves nothing reads data before
# the settings are checked (test_user_mistakes, test_readme).
DATA_BUILDERS = [
    (adloco_hf.data, "load_text_corpus"),
    (adloco_hf.data, "load_or_train_tokenizer"),
    (adloco_hf.data, "build_lm_datasets"),
    (adloco_hf.presets, "build_model"),
]
