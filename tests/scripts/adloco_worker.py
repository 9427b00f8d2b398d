"""A worker of the multi-process tests: `accelerate launch --multi_gpu --num_processes P adloco_worker.py SPEC_JSON`.

SPEC_JSON holds `output_dir`, `world_size` (asserted inside every worker; a list: any of them), `config` (AdLoCoConfig
overrides),
`probe_dir` (where workers write what they observed) and optional `eval`, `resume`, `nan`, `fail`, `kill_in_save`,
`stream` (train on a PackedStream of local shards, see `streamed_data`),
`hang_in_save` ([rank, step]: that rank sleeps inside its checkpoint save) and `disk_full` ([rank, step, target]:
`torch.save` or `save_pretrained` fails there as on a full disk), `kill_in_merged_save` (rank 0 dies inside the
final `merged/` save, its weights written but the folder not yet renamed into place) settings, `num_samples`,
`record_passes` (every draw of the map-style sampler, with its pass and step, to `passes-rank{R}.jsonl`),
`record_documents` (every document a streamed worker tokenises, with its pass and step, to `documents-rank{R}.jsonl`) and
`probe_resume` (right after AdLoCo restored a checkpoint: φ, momentum and AdamW moments to `resume-rank{R}.safetensors`),
`record_collate` (the process that collated every batch of the training loader, and its size, to
`collate-rank{R}.jsonl`: with `dataloader_num_workers` the loader's worker processes),
`final_gather` (default true: the workers' final weights all-gathered and compared),
`model` (`tiny_llama_config` overrides: a heavier step), `kills`, `progress` and `phases` (SIGKILLs at chosen points
of chosen launch attempts, every attempt's start and steps with their wall time, and when each outer step and merge
begin and end: `recipes/benchmarks/toolkit/worker/kills.py`), `slow` ({rank or "all": seconds}: a delay per sample
inside every inner step of those ranks, a slow worker) and `step_clock` (`helpers.StepClock`'s arguments: the goodput
rule's step timings from a deterministic clock). The faults (`nan`, `fail`, `kill_in_save`, `hang_in_save`,
`disk_full`, `kill_in_merged_save`, `slow`, `sigterm`, `preemption_poll`, `preemption_agree_seconds`,
`wait_for_stop_request`) and the kills are the fault benchmarks' own (`recipes/benchmarks/toolkit/worker/faults.py`,
`kills.py`), armed here at the same points of the run as there, around this worker's probes.
Assertions that need several ranks' tensors run here, inside the workers; the test reads the probe files.
"""

import atexit
import hashlib
import json
import os
import sys

import safetensors.torch
import torch
import torch.distributed as dist
from transformers import TrainerCallback, default_data_collator


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import NORM_TEST, StepClock, flat_params, sequence_dataset, tiny_model  # noqa: E402

import adloco_hf.instances.merges as merging  # noqa: E402
from adloco_hf import AdLoCoConfig  # noqa: E402
from adloco_hf.batch.lr_scaling import batch_ratio, lr_factor  # noqa: E402
from adloco_hf.batch.switch_mode import plan_batch  # noqa: E402
from recipes.benchmarks.toolkit.worker.faults import FaultyTrainer, arm_faults  # noqa: E402
from recipes.benchmarks.toolkit.worker.kills import arm_kills, record_phases, record_progress  # noqa: E402


def gather_params(model) -> torch.Tensor:
    return gather_flat(flat_params(model))


def gather_flat(local: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local)
    return torch.stack(parts)


def leaders(engine, workers) -> list[int]:
    """The global rank of local rank 0 of each worker (the workers themselves with one process per worker)."""
    return [engine.layout.rank(w, 0) for w in workers]


def processes(engine, workers) -> list[int]:
    return list(engine.layout.ranks_of_workers(workers))


class InWorker(TrainerCallback):
    """processes_per_worker > 1: the processes of a worker hold the same replica after every inner step (DDP)."""

    def __init__(self, trainer):
        self.trainer, self.steps_checked = trainer, 0

    def on_step_end(self, args, state, control, **kwargs):
        engine = self.trainer.worker
        stacked = gather_params(self.trainer.model)
        for w in range(engine.num_workers):
            rows = stacked[list(engine.layout.ranks_of(w))]
            assert torch.equal(rows, rows[:1].expand_as(rows)), f"worker {w}'s processes differ at {state.global_step}"
        self.steps_checked += 1


class BeforeSync(TrainerCallback):
    """Runs before AdLoCoCallback: sees every worker's weights at the end of a round, before the outer step, and the
    samples each process trained in the round (the weights of the instance's average of pseudo-gradients)."""

    def __init__(self, trainer, spec):
        self.trainer, self.spec, self.pre_sync, self.pre_sync_samples = trainer, spec, None, None
        self.min_spread_inside = float("inf")
        self.spread_checks = 0  # how often min_spread_inside was measured (a probe that never ran passes otherwise)
        self.round_start = 0  # the first of this round's batches in `seen_batches`

    def on_step_end(self, args, state, control, **kwargs):
        round_end = self.trainer.worker.is_round_end(state.global_step)  # H may grow (inner_steps_rule)
        if not round_end and state.global_step % 3 != 1:
            return
        stacked = gather_params(self.trainer.model)
        for inst in self.trainer.worker.instances:
            if len(inst.workers) > 1:
                members = stacked[leaders(self.trainer.worker, inst.workers)]
                assert not all(torch.equal(m, members[0]) for m in members[1:]), (
                    f"replicas of instance {inst.id} are identical inside a round at step {state.global_step}"
                )
                spread = (members - members[0]).abs().nan_to_num(nan=float("inf")).max().item()
                self.min_spread_inside = min(self.min_spread_inside, spread)
                self.spread_checks += 1
        if round_end:
            self.pre_sync = stacked
            seen = getattr(self.trainer, "seen_batches", [])
            self.pre_sync_samples = gather_flat(torch.tensor([float(sum(seen[self.round_start :]))]))[:, 0]
            self.round_start = len(seen)


class AfterSync(TrainerCallback):
    """Runs after AdLoCoCallback: replicas must be identical after every outer step."""

    def __init__(self, trainer, before, spec):
        self.trainer, self.before, self.spec = trainer, before, spec
        self.rounds, self.max_mean_error, self.sampler_sizes, self.lr_factors = 0, 0.0, [], []
        self.mean_checks = 0  # rounds whose φ was compared with the mean of the pre-sync weights
        self.round_samples = []  # each checked round's samples per process: the weights of that mean

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer.worker.last_synced_step != state.global_step:  # not a round's end
            return
        self.rounds += 1
        engine = self.trainer.worker
        stacked = gather_params(self.trainer.model)
        # Overlapped outer steps (eager updates) start each worker from φ + its own offset, and with fragments the
        # workers' weights differ between syncs: there φ is what the workers of an instance share.
        apart = args.outer_overlap or args.num_fragments is not None
        shared = gather_flat(engine.global_model.phi.detach()) if apart else stacked
        for inst in engine.instances:
            members = shared[processes(engine, inst.workers)]
            assert torch.equal(members, members[:1].expand_as(members)), (
                f"instance {inst.id} replicas differ after sync"
            )
        if (
            args.outer_lr == 1.0
            and args.num_fragments is None
            and args.outer_momentum == 0.0
            and len(engine.instances) == 1
            and engine.totals.merges == 0
        ):
            # The average weighs each worker by the samples it trained in the round (the plain mean when equal):
            # φ = Σ_p (n_p / N) θ_p over the processes (a worker's processes hold the same replica).
            samples = self.before.pre_sync_samples.double()
            mean = (self.before.pre_sync.double() * (samples / samples.sum())[:, None]).sum(0).float()
            self.max_mean_error = max(self.max_mean_error, (stacked[0] - mean).abs().max().item())
            self.mean_checks += 1
            self.round_samples.append(samples.tolist())
        request = engine.instance.batch_size // engine.processes_per_worker
        requested = plan_batch(request, engine.max_batch_size, args.switch_threshold).batch_size
        # worker_batch_split="speed": this worker draws its share of the instance's total (its processes 1/G each).
        g, inst = engine.processes_per_worker, engine.instance
        expected = inst.split(g * requested)[inst.workers.index(engine.worker_id)] // g
        assert self.trainer.train_sampler.batch_size == expected
        self.sampler_sizes.append(expected)
        # The next step's learning rate is the schedule's, times the factor of the batch the instance requests (the
        # same on all its workers; also right after a merge handed this worker another worker's optimizer state).
        scheduler = self.trainer.lr_scheduler
        factor = lr_factor(args.lr_batch_scaling, batch_ratio(requested, args.per_device_train_batch_size))
        lr = args.learning_rate * scheduler.lr_lambdas[0](scheduler.last_epoch) * factor
        assert abs(self.trainer.optimizer.param_groups[0]["lr"] - lr) <= 1e-12 + 1e-6 * lr, (state.global_step, lr)
        self.lr_factors.append(factor)


class FragmentProbe(TrainerCallback):
    """Streaming DiLoCo (`num_fragments`): after every inner step where a fragment's average was applied (the same
    steps on every rank), φ is identical on the workers of each instance."""

    def __init__(self, trainer):
        self.trainer, self.checks = trainer, 0

    def on_step_end(self, args, state, control, **kwargs):
        engine = self.trainer.worker
        streaming = engine.global_model.streaming
        if not streaming.applied or streaming.applied[-1][0] != state.global_step:
            return
        shared = gather_flat(engine.global_model.phi.detach())
        for inst in engine.instances:
            members = shared[processes(engine, inst.workers)]
            assert torch.equal(members, members[:1].expand_as(members)), (
                f"instance {inst.id}'s φ differs after fragment {streaming.applied[-1][1]} at {state.global_step}"
            )
        self.checks += 1


class EvalProbe(TrainerCallback):
    """Compares each instance's logged eval loss with evaluating this worker's own weights directly."""

    def __init__(self, trainer):
        self.trainer, self.checks = trainer, []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        engine = self.trainer.worker
        model = self.trainer.model
        total, count = 0.0, 0
        with torch.no_grad():
            for start in range(0, len(self.trainer.eval_dataset), 16):
                rows = [
                    self.trainer.eval_dataset[i] for i in range(start, min(start + 16, len(self.trainer.eval_dataset)))
                ]
                batch = default_data_collator(rows)
                logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
                labels = batch["labels"][:, 1:]
                total += torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"
                ).item()
                count += labels.numel()
        if engine.final_merged or len(engine.instances) < 2:
            key = "eval_merged_loss" if engine.final_merged else "eval_loss"
            instance = "merged" if engine.final_merged else engine.instance.id
        else:
            key, instance = f"eval_instance_{engine.instance.id}_loss", engine.instance.id
        logged = metrics[key]
        engine.reshard()  # FSDP: the forward above leaves the root unsharded (no-op otherwise)
        self.checks.append(
            {"instance": instance, "logged": logged, "direct": total / count, "step": state.global_step}
        )
        assert abs(logged - total / count) < 1e-5, (logged, total / count)


class RecordingTrainer(FaultyTrainer):
    """Records the batch each inner step really received, before the faults of `FaultyTrainer` (NaN, a slow step)."""

    collate_log: str | None = None  # record_collate: where the training loader's collations are recorded

    def get_train_dataloader(self):
        loader = super().get_train_dataloader()
        if self.collate_log is not None:  # set before the loader's first iteration starts its processes
            loader.collate_fn = CollateRecorder(self.collate_log, loader.collate_fn)
        return loader

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.seen_batches = getattr(self, "seen_batches", [])
        self.seen_inputs = getattr(self, "seen_inputs", {})
        batch = int(inputs["input_ids"].shape[0])
        self.seen_batches.append(batch)
        digest = hashlib.sha1(inputs["input_ids"].cpu().numpy().tobytes()).hexdigest()[:16]
        self.seen_inputs[str(self.state.global_step)] = [batch, digest]  # the samples and their order, per step
        return super().training_step(model, inputs, num_items_in_batch)


def spy_on_merges(probe_dir: str, rank: int) -> None:
    """Save this rank's global weights right before each merge (for the merge-equals-weighted-average test)."""
    original = merging.merge_at_round_end  # the worker's one way into a merge, whatever its transport
    counter = [0]

    def spy(plan, where, *, place, global_model, **kwargs):
        step = counter[0]
        counter[0] += 1
        if place.local_rank != 0:  # a worker of several processes: its local rank 0 speaks for it
            return original(plan, where, place=place, global_model=global_model, **kwargs)
        path = f"premerge-rank{place.worker}-{step}-i{plan.survivor}-{plan.merged}.safetensors"
        safetensors.torch.save_file(
            {"phi": global_model.phi.detach().cpu().contiguous()}, os.path.join(probe_dir, path)
        )
        return original(plan, where, place=place, global_model=global_model, **kwargs)

    merging.merge_at_round_end = spy


class FakeHubApi:
    """Records what would be uploaded (no machine here reaches the Hub)."""

    def __init__(self, log_path: str):
        self.log_path = log_path

    def _record(self, entry):
        with open(self.log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def create_repo(self, repo_id, private=None, exist_ok=False, **kwargs):
        self._record({"call": "create_repo", "repo_id": repo_id})
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, commit_message=None, revision=None):
        files = sorted(os.listdir(folder_path))
        self._record({"call": "upload_folder", "repo_id": repo_id, "path_in_repo": path_in_repo, "files": files})
        return "commit"


class CollateRecorder:
    """The training loader's collate function, recording which process collated each batch."""

    def __init__(self, path, collate):
        self.path, self.collate = path, collate

    def __call__(self, features):
        with open(self.path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "size": len(features)}) + "\n")
        return self.collate(features)


class PassRecorder(TrainerCallback):
    """Records every draw of the map-style sampler as {step, parts: [[pass, indices], ...]}, flushed per draw so a
    worker that dies keeps what it drew (the step is the Trainer's before the draw: draws for steps 1..10 are 0..9)."""

    def __init__(self, trainer, path):
        self.trainer, self.path = trainer, path

    def on_train_begin(self, args, state, control, **kwargs):
        sampler, trainer = self.trainer.train_sampler, self.trainer
        draw = sampler.next_batch_by_pass

        def recorded():
            parts = draw()
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": trainer.state.global_step, "parts": parts}) + "\n")
            return parts

        sampler.next_batch_by_pass = recorded


class DocumentRecorder(TrainerCallback):
    """Records every document a streamed worker reads as {step, pass, doc} (its sentinel word), flushed per document
    (the step is the Trainer's before the draw, as `PassRecorder`'s)."""

    def __init__(self, trainer, path):
        self.trainer, self.path = trainer, path

    def on_train_begin(self, args, state, control, **kwargs):
        source, trainer = self.trainer.train_sampler.part.source, self.trainer
        read = source.next_example

        def recorded():
            example = read()
            record = {
                "step": trainer.state.global_step,
                "pass": source.reading_pass,
                "doc": example["text"].split()[0],
            }
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
            return example

        source.next_example = recorded


class ResumeProbe(TrainerCallback):
    """After AdLoCo's own start (a resume applied): this worker's φ, momentum and AdamW moments, in parameter order."""

    def __init__(self, trainer, path):
        self.trainer, self.path = trainer, path

    def on_train_begin(self, args, state, control, **kwargs):
        engine, optimizer = self.trainer.worker, self.trainer.optimizer
        moments = optimizer.state_dict()["state"]
        tensors = {"phi": engine.global_model.phi.detach().cpu().contiguous()}
        if engine.global_model.momentum is not None:
            tensors["momentum"] = engine.global_model.momentum.detach().cpu().contiguous()
        for key in ("exp_avg", "exp_avg_sq"):
            tensors[key] = torch.cat([moments[i][key].reshape(-1) for i in sorted(moments)]).contiguous()
        rng = engine.parts.steps.rng_to_restore  # the generators the first inner step will draw from
        if rng is not None:
            tensors["rng_cpu"] = rng["cpu"].contiguous()
        safetensors.torch.save_file(tensors, self.path)


def streamed_data(stream: dict, *, with_eval: bool):
    """`stream`: {"shards": [JSON-lines files of helpers.write_c4_shards], "documents", "block_size"}: a PackedStream
    over the shards (word tokenizer: the tiny model's 64-token vocabulary holds up to 46 documents), and with
    `with_eval` a map-style eval set of the first 4 documents, held out of it."""
    from helpers import word_tokenizer

    from adloco_hf.data import PackedStream, build_lm_stream, load_document_stream

    documents = load_document_stream("allenai/c4", data_files=stream["shards"])
    tokenizer = word_tokenizer(num_documents=stream["documents"])
    if with_eval:
        return build_lm_stream(documents, tokenizer, block_size=stream["block_size"], eval_documents=4)
    return PackedStream(documents, tokenizer, block_size=stream["block_size"]), None


def record_exit_state(path: str) -> None:
    """Registered before training, so it runs after the library's own exit hook (atexit is last in, first out)."""
    with open(path, "w") as f:
        json.dump({"process_group_alive": dist.is_initialized()}, f)


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("fake_hub"):
        import adloco_hf.reporting.hub as hub

        log = os.path.join(spec["probe_dir"], f"hub-rank{os.environ.get('RANK', '0')}.jsonl")
        os.makedirs(spec["probe_dir"], exist_ok=True)
        hub.get_hub_api = lambda token=None: FakeHubApi(log)
    args = AdLoCoConfig(
        **{
            "use_cpu": True,
            "report_to": [],
            "disable_tqdm": True,
            "log_level": "warning",
            "plot_run": False,
            # the norm test's requests unless the spec names a target (NORM_TEST in tests/helpers.py: they repeat)
            **NORM_TEST,
            **spec["config"],
        }
    )
    # A list: any of these world sizes (an elastic launcher may restart the run with fewer machines).
    sizes = spec["world_size"] if isinstance(spec["world_size"], list) else [spec["world_size"]]
    assert dist.is_initialized() and dist.get_world_size() in sizes, dist.get_world_size()
    rank = dist.get_rank()
    probe_dir = spec["probe_dir"]
    os.makedirs(probe_dir, exist_ok=True)
    os.makedirs(os.path.join(probe_dir, "merges"), exist_ok=True)
    spy_on_merges(os.path.join(probe_dir, "merges"), rank)
    atexit.register(record_exit_state, os.path.join(probe_dir, f"exit-rank{rank}.json"))
    if spec.get("stream") is not None:
        data, eval_data = streamed_data(spec["stream"], with_eval=bool(spec.get("eval")))
    else:
        data = sequence_dataset(spec.get("num_samples", 512))
        eval_data = data.select(range(spec.get("num_eval", 48))) if spec.get("eval") else None
    # Attention dropout makes a resumed run depend on every worker's random generators, not only on its weights.
    dropout = {"attention_dropout": spec["dropout"]} if spec.get("dropout") else {}
    shape = {"hidden_size": 48} if spec.get("mismatch_rank") == rank else spec.get("model", {})
    model = tiny_model(**shape, **dropout)
    trainer = RecordingTrainer(model=model, args=args, train_dataset=data, eval_dataset=eval_data)
    if spec.get("record_collate"):
        trainer.collate_log = os.path.join(probe_dir, f"collate-rank{rank}.jsonl")
    before = BeforeSync(trainer, spec)
    after = AfterSync(trainer, before, spec)
    if spec.get("probes", True):  # the probes' own collectives would block on a lost worker first
        trainer.callback_handler.callbacks.insert(0, before)
        trainer.add_callback(after)
    probe = EvalProbe(trainer)
    trainer.add_callback(probe)
    fragments = FragmentProbe(trainer)
    if args.num_fragments is not None and spec.get("probes", True):
        trainer.add_callback(fragments)
    in_worker = InWorker(trainer)
    if args.processes_per_worker > 1 and spec.get("probes", True):
        trainer.add_callback(in_worker)
    arm_faults(trainer, model, spec, rank)  # after the probes: their callbacks run first
    if spec.get("record_passes"):
        trainer.add_callback(PassRecorder(trainer, os.path.join(probe_dir, f"passes-rank{rank}.jsonl")))
    if spec.get("record_documents"):
        trainer.add_callback(DocumentRecorder(trainer, os.path.join(probe_dir, f"documents-rank{rank}.jsonl")))
    if spec.get("probe_resume"):
        trainer.add_callback(ResumeProbe(trainer, os.path.join(probe_dir, f"resume-rank{rank}.safetensors")))
    if spec.get("kills") is not None:
        arm_kills(trainer, spec["kills"], rank, spec.get("hold_for_signal"))
    if spec.get("step_clock") is not None:  # batch_size_target="goodput" timed by a deterministic clock
        StepClock(**spec["step_clock"]).install(trainer)
    if spec.get("progress"):  # after the trainer's own callbacks: a step is recorded once its round's end has run
        record_progress(trainer, rank, probe_dir)
    if spec.get("phases"):  # when each outer step and merge begin and end (the netfaults benchmark's triggers)
        record_phases(trainer, rank, probe_dir)
    trainer.train(resume_from_checkpoint=spec.get("resume"))
    final = flat_params(trainer.model)
    if spec.get("final_gather", True):  # False: no all-gather of every weight (over a 1 Mbit/s link it outlasts the
        # run's ddp_timeout: the netfaults benchmark's slowed link)
        stacked = gather_params(trainer.model)
        assert torch.equal(stacked, stacked[:1].expand_as(stacked)), "workers hold different models at the end"
    safetensors.torch.save_file(
        {"params": final.contiguous()}, os.path.join(probe_dir, f"final-rank{rank}.safetensors")
    )
    report = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "rounds_checked": after.rounds,
        "max_mean_error": after.max_mean_error,
        "mean_checks": after.mean_checks,
        "min_spread_inside_round": before.min_spread_inside,
        "spread_checks": before.spread_checks,
        "sampler_sizes": after.sampler_sizes,
        "lr_factors": after.lr_factors,
        "round_samples": after.round_samples,
        "seen_batches": getattr(trainer, "seen_batches", []),  # none when a resumed run had no step left
        "seen_inputs": getattr(trainer, "seen_inputs", {}),  # step → [batch, digest of its input_ids]
        "pid": os.getpid(),
        "eval_checks": probe.checks,
        "instances": [[i.id, list(i.workers), i.batch_size] for i in trainer.worker.instances],
        "worker_id": trainer.worker.worker_id,
        "steps_checked_in_worker": in_worker.steps_checked,
        "part": list(trainer.worker.global_model.part or (0, trainer.worker.global_model.numel)),
        "numel": trainer.worker.global_model.numel,
        "clock_merges": getattr(trainer.worker.clock, "merges", None),  # a StepClock's record of Clock.merge
    }
    streaming = trainer.worker.global_model.streaming
    if streaming is not None:  # (step, fragment) of every send and applied average of this run (since its resume)
        report.update(fragment_sent=streaming.sent, fragment_applied=streaming.applied, phi_checks=fragments.checks)
    with open(os.path.join(probe_dir, f"report-rank{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
