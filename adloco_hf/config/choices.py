"""The allowed values of every `AdLoCoConfig` field that takes a choice: one list each, read by the config's checks,
its `--help` choices, and the code that acts on the value (nothing else spells them out)."""

__all__ = [
    "ADAM_RULES",
    "BATCH_SIZE_TARGETS",
    "BATCH_SIZE_TESTS",
    "CPU_AUTO_MAX_BATCH_SIZE",
    "INNER_STEPS_RULES",
    "INSTANCE_INITS",
    "LR_SCALING_RULES",
    "MERGE_BATCH_RULES",
    "MERGE_PAYLOADS",
    "MERGE_POLICIES",
    "MERGE_TRANSPORTS",
    "NOISE_PRECONDITIONERS",
    "NONPOSITIVE_SIGNAL",
    "OUTER_STATE_DEVICES",
    "PSEUDO_GRAD_COMPRESSIONS",
    "PSEUDO_GRAD_DTYPES",
    "WORKER_BATCH_SPLITS",
    "WORKER_PARALLELISMS",
]

# Rounds and instances
INNER_STEPS_RULES = ("fixed", "outer_noise")
INSTANCE_INITS = ("shared", "independent")
MERGE_POLICIES = ("smallest_pair", "largest_smallest")
MERGE_TRANSPORTS = ("all_reduce", "point_to_point")
MERGE_PAYLOADS = ("float32", "compact")
MERGE_BATCH_RULES = ("preserve_total", "paper")
WORKER_PARALLELISMS = ("ddp", "fsdp")

# The batch: its test, the controller that moves the request, the learning rate that follows it
BATCH_SIZE_TESTS = ("norm", "inner_product", "augmented_inner_product", "none")
# "auto" (the default) resolves when the config is built: "goodput" with the norm test, "test" otherwise
# (`resolve_batch_size_target`); the controller only ever sees the other three.
BATCH_SIZE_TARGETS = ("auto", "test", "noise_scale", "goodput")
NONPOSITIVE_SIGNAL = ("keep", "clamp")
# Where the goodput rule's step and round costs come from (`batch/startup_profile.py`): a profile measured once before
# the first round (repeatable from the seed), that profile and then every round's timings, or the rounds alone.
GOODPUT_TIMINGS = ("startup", "startup_live", "live")
NOISE_PRECONDITIONERS = ("none", "adam")
LR_SCALING_RULES = ("none", "sqrt", "sqrt_adam", "linear")
ADAM_RULES = ("sqrt_adam",)  # the rules that rewrite betas, eps and weight_decay as well
WORKER_BATCH_SPLITS = ("equal", "speed")  # an instance's batch among its workers: evenly, or by measured speed
# What `max_batch_size="auto"` means without CUDA: CPU memory is rarely the limit for the small models trained there,
# and the micro-batch then only trades speed for memory.
CPU_AUTO_MAX_BATCH_SIZE = 32

# Communication
PSEUDO_GRAD_DTYPES = ("float32", "bfloat16", "float16")
OUTER_STATE_DEVICES = ("device", "cpu")
PSEUDO_GRAD_COMPRESSIONS = ("none", "int8", "int4")
