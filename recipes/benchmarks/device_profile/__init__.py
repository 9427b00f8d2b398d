"""Device profiles for the virtual clock (`convergence --clock virtual --device_profile FILE`), written with their
source: from `gpu_bench`'s throughput step on a GPU, or from `overhead --step_profile` (CPU workers under the same
contention as a launch's). What each profile measured and what it interpolates is in the file
(`toolkit/clock/device_profiles.py`).

    # The H200 profile of docs/results/device_profiles/ (MicroLlama's shape, compiled, bf16; α and ω estimated):
    python -m recipes.benchmarks.device_profile --throughput docs/results/device_profiles/nvidia-h200-throughput-300m.json \\
        --pass_seconds 0.003 --optimizer_seconds 0.002 --parameters 247489536 \\
        --output docs/results/device_profiles/nvidia-h200-microllama.json
    # 4 CPU workers of the tiny model on this machine's 2 cores (what the links testbed runs):
    python -m recipes.benchmarks.overhead --step_profile 1 2 3 4 6 8 12 16 --step_profile_processes 4 \\
        --step_profile_trainer_batch 4 --step_profile_only --output_dir outputs/benchmarks/step-profile
    python -m recipes.benchmarks.device_profile --step_profile outputs/benchmarks/step-profile/results.json \\
        --output docs/results/device_profiles/cpu-2cores-tiny-4workers.json
"""

from recipes.benchmarks.device_profile.cli import main, parse_args


__all__ = ["main", "parse_args"]
