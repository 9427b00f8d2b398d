"""The Trainer's speed levers with `AdLoCoTrainer` (issue 24): with each lever, one worker trains as the plain
`Trainer` with the same lever does, and AdLoCo's own work keeps running under it.

Every run here is one worker whose request stays at 8 samples (`batch_size_cap=8`) with `max_batch_size=2`, so switch
mode accumulates every step as 4 micro-batches, and the norm test measures gradient statistics on every round's last
step (the hooks of `batch/grad_stats.py` on the micro-batches). With plain averaging (`outer_lr=1`, no momentum) that
is the plain Trainer's training on the same batches of 8, up to the rounding of the lever's arithmetic. Each test
checks three things: the lever acted (bf16 autocast, a compiled model, the fused AdamW, the attention kernel,
checkpointed layers), the weights equal the plain Trainer's with the same lever (closer to it than to the plain
Trainer without the lever, where the lever changes the arithmetic), and the statistics equal those of the run without
the lever, round by round.

torch.compile runs with the `aot_eager` backend here: dynamo and AOT autograd are where the statistics' hooks, the
halves and the micro-batches meet the compiler (graphs, graph breaks, recompiles), and inductor's code generation,
identical for both trainers, would cost ~20 s per graph on a CPU; `recipes/benchmarks/gpu_bench/` measures
inductor (`--tiny` runs it on the CPU). Flash-attention and Liger's Triton kernels run on CUDA only: their runs are
`cuda` tests; on a CPU only Liger's patch is checked (AdLoCoTrainer applies the Trainer's own).
"""

import json
import os

import pytest
import torch
from helpers import TINY_TRAINING, flat_params, sequence_dataset, tiny_model, tiny_run_config
from transformers import Trainer, TrainingArguments

from adloco_hf import AdLoCoTrainer
from adloco_hf.sampling.sampler import AdaptiveBatchSampler


STEPS, H, BATCH, MICRO = 12, 6, 8, 2
ON_CUDA = pytest.mark.cuda

# lever name -> (TrainingArguments fields, model config fields)
LEVERS = {
    "none": ({}, {}),
    "bf16": ({"bf16": True}, {}),
    "torch_compile": ({"torch_compile": True, "torch_compile_backend": "aot_eager"}, {}),
    "fused_adamw": ({"optim": "adamw_torch_fused"}, {}),
    "sdpa": ({}, {"attn_implementation": "sdpa"}),
    "eager_attention": ({}, {"attn_implementation": "eager"}),
    "gradient_checkpointing": ({"gradient_checkpointing": True}, {}),
}
# Largest difference from the plain Trainer's weights with the same lever, relative to how far training moved them
# (‖θ − θ_plain‖ / ‖θ_plain − θ_0‖): float32 levers differ only by the order of the micro-batches' sums (measured
# 4.5e-6); in bf16 the micro-batches round differently from the whole batch (measured 0.026, against 0.076 between
# bf16 and float32).
FLOAT32, BF16 = 1e-4, 0.05


def lever_model(model_fields: dict, device: str = "cpu"):
    model = tiny_model()
    if "attn_implementation" in model_fields:
        model.set_attn_implementation(model_fields["attn_implementation"])
    return model.to(device)


def batches_in_order(num_samples: int, seed: int) -> list[int]:
    """The samples AdLoCo's sampler gives its one worker, step after step (the plain Trainer reads them in order)."""
    sampler = AdaptiveBatchSampler(num_samples, batch_size=BATCH, num_workers=1, rank=0, seed=seed)
    return sum((sampler.next_batch() for _ in range(STEPS)), [])


def make_adloco(tmp_path, name: str, device: str = "cpu", **extra) -> AdLoCoTrainer:
    fields, model_fields = LEVERS[name]
    settings = dict(
        max_steps=STEPS, inner_steps=H, per_device_train_batch_size=BATCH, max_batch_size=MICRO,
        batch_size_test="norm", batch_size_cap=BATCH, outer_lr=1.0, outer_momentum=0.0, use_cpu=device == "cpu",
    )  # fmt: skip
    args = tiny_run_config(tmp_path / f"adloco-{name}-{device}", **(settings | fields | extra))
    return AdLoCoTrainer(model=lever_model(model_fields, device), args=args, train_dataset=sequence_dataset(256))


def make_plain(tmp_path, name: str, device: str = "cpu", **extra) -> Trainer:
    fields, model_fields = LEVERS[name]
    data = sequence_dataset(256)
    args = TrainingArguments(
        **TINY_TRAINING
        | dict(output_dir=str(tmp_path / f"plain-{name}-{device}"), max_steps=STEPS, per_device_train_batch_size=BATCH,
               train_sampling_strategy="sequential", use_cpu=device == "cpu")
        | fields | extra
    )  # fmt: skip
    order = batches_in_order(len(data), args.seed)
    return Trainer(model=lever_model(model_fields, device), args=args, train_dataset=data.select(order))


def trained(trainer):
    trainer.train()
    return trainer


def rounds(trainer) -> list[dict]:
    with open(os.path.join(trainer.args.output_dir, "adloco_rounds.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """AdLoCo and the plain Trainer without any lever (shared by every lever's test)."""
    tmp_path = tmp_path_factory.mktemp("levers")
    return {"adloco": trained(make_adloco(tmp_path, "none")), "plain": trained(make_plain(tmp_path, "none"))}


def assert_lever_acted(name: str, trainer) -> None:
    model = trainer.accelerator.unwrap_model(trainer.model_wrapped, keep_torch_compile=True)
    if name == "bf16":
        assert trainer.accelerator.mixed_precision == "bf16"
    elif name == "torch_compile":
        assert isinstance(trainer.model_wrapped, torch._dynamo.eval_frame.OptimizedModule), type(trainer.model_wrapped)
        assert model is trainer.model_wrapped
    elif name == "fused_adamw":
        groups = getattr(trainer.optimizer, "optimizer", trainer.optimizer).param_groups
        assert all(group.get("fused") for group in groups)
    elif name in ("sdpa", "eager_attention"):
        assert trainer.model.config._attn_implementation == LEVERS[name][1]["attn_implementation"]
    elif name == "gradient_checkpointing":
        assert trainer.model.is_gradient_checkpointing


def check_lever(name: str, adloco, plain, reference: dict, tolerance: float = FLOAT32) -> None:
    """The lever acted in both trainers; AdLoCo's weights are the plain Trainer's with the lever (within
    `tolerance`); the statistics of every round equal those without the lever; switch mode accumulated every step.
    A tolerance above float32's is a lever that changes the arithmetic: AdLoCo must then be closer to the plain
    Trainer with the lever than to the one without."""
    rounding = tolerance > FLOAT32
    for trainer in (adloco, plain):
        assert_lever_acted(name, trainer)
    ours, theirs = flat_params(adloco.model), flat_params(plain.model)
    moved = (theirs - flat_params(tiny_model()).to(theirs.device)).norm().item()
    assert moved > 0.1  # it did train
    difference = (ours - theirs).norm().item() / moved
    assert difference < tolerance, difference
    if rounding:  # the lever changes the arithmetic: AdLoCo ran with it, not without
        without = flat_params(reference["plain"].model).to(ours.device)
        assert difference < (ours - without).norm().item() / moved / 2
    lines, expected = rounds(adloco), rounds(reference["adloco"])
    assert [(line["batch_size"], line["accumulation_steps"]) for line in lines] == [(BATCH, BATCH // MICRO)] * 2
    for line, want in zip(lines, expected, strict=True):
        for key in ("grad_sq_norm", "grad_variance"):
            assert line[key] == pytest.approx(want[key], rel=0.05 if rounding else 1e-3), (key, line, want)


@pytest.mark.parametrize("name", [n for n in LEVERS if n != "none"])
def test_each_lever_trains_as_the_plain_trainer_with_it_and_keeps_the_statistics(tmp_path, reference, name):
    adloco, plain = trained(make_adloco(tmp_path, name)), trained(make_plain(tmp_path, name))
    check_lever(name, adloco, plain, reference, BF16 if name == "bf16" else FLOAT32)


def test_the_reference_runs_accumulate_and_measure(reference):
    """What the lever tests compare with: statistics in every round, equal weights without any lever."""
    lines = rounds(reference["adloco"])
    assert len(lines) == STEPS // H and all(line["grad_variance"] > 0 for line in lines)
    ours, theirs = flat_params(reference["adloco"].model), flat_params(reference["plain"].model)
    assert (ours - theirs).norm() / (theirs - flat_params(tiny_model())).norm() < FLOAT32


def test_compiled_statistics_cost_one_graph_for_the_halves_and_no_graph_break(tmp_path):
    """A compiled AdLoCo worker whose request fits at once: its statistics step runs two halves of the batch under
    the hooks. Dynamo builds the graph of the whole batch, then one more for the halves, whose batch dimension it
    marks dynamic; the hooks (on the parameters, outside the graph) add no graph break and no recompile."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    trainer = trained(make_adloco(tmp_path, "torch_compile", max_batch_size=BATCH))
    assert [line["accumulation_steps"] for line in rounds(trainer)] == [1, 1]
    assert all(line["grad_variance"] > 0 for line in rounds(trainer))
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_liger_kernels_patch_the_model_as_the_plain_trainer_does(tmp_path):
    """On a CPU Liger's Triton kernels cannot run ('0 active drivers'); its patch of the model (forward methods
    replaced on the instances when training starts) is the Trainer's, and AdLoCoTrainer applies that same patch."""
    pytest.importorskip("liger_kernel.transformers")
    patched = {}
    for kind, make in (("adloco", make_adloco), ("plain", make_plain)):
        trainer = make(tmp_path / kind, "none", use_liger_kernel=True)
        with pytest.raises(RuntimeError, match="active drivers"):
            trainer.train()
        patched[kind] = forwards(trainer.model)
    assert patched["adloco"] == patched["plain"]
    assert {"lce_forward", "LigerRMSNorm.forward", "LigerSwiGLUMLP.forward"} <= set(patched["adloco"].values())


def forwards(model) -> dict[str, str]:
    """Module name -> the name of its forward, for those whose forward was replaced on the instance."""
    return {
        name: getattr(module.forward, "__qualname__", "").rpartition("<locals>.")[2]
        for name, module in model.named_modules()
        if "forward" in vars(module)
    }


# ---- on a GPU: the levers in CUDA arithmetic, flash-attention and Liger's kernels ----
CUDA_LEVERS = {
    "bf16": {},
    "torch_compile": {"torch_compile_backend": "inductor", "bf16": True},
    "fused_adamw": {"bf16": True},
    "gradient_checkpointing": {"bf16": True},
}


@ON_CUDA
@pytest.mark.parametrize("name", list(CUDA_LEVERS))
def test_each_lever_on_cuda(tmp_path, reference, name):
    extra = CUDA_LEVERS[name]
    adloco = trained(make_adloco(tmp_path, name, "cuda", **extra))
    plain = trained(make_plain(tmp_path, name, "cuda", **extra))
    check_lever(name, adloco, plain, reference, BF16)


@ON_CUDA
@pytest.mark.parametrize("kernel", ["flash_attention_2", "liger"])
def test_flash_attention_and_liger_on_cuda(tmp_path, reference, kernel):
    if kernel == "flash_attention_2":
        pytest.importorskip("flash_attn")
        extra, LEVERS[kernel] = {"bf16": True}, ({}, {"attn_implementation": "flash_attention_2"})
    else:
        pytest.importorskip("liger_kernel.transformers")
        extra, LEVERS[kernel] = {"bf16": True, "use_liger_kernel": True}, ({}, {})
    adloco = trained(make_adloco(tmp_path, kernel, "cuda", **extra))
    plain = trained(make_plain(tmp_path, kernel, "cuda", **extra))
    check_lever(kernel, adloco, plain, reference, BF16)
