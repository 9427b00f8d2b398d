"""Resume attempts in one launch: `accelerate launch --multi_gpu --num_processes P resume_worker.py SPEC_JSON`.

SPEC_JSON holds `world_size` (asserted inside every worker), `probe_dir` and `attempts`: each has a `name`, the
`checkpoint` to resume from, the `config` (AdLoCoConfig overrides, with its own `output_dir`) and optional `model`
(`tiny_llama` overrides) and `dropout`. Every worker tries each attempt in turn and writes what happened to
`{probe_dir}/{name}-rank{R}.json`: `{"accepted": true}` when training ran to the end, else the error's type, whether
it is a ValueError, and its message. A refusal comes before any collective, so the workers stay in step from one
attempt to the next.
"""

import json
import os
import sys

import torch.distributed as dist


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import NORM_TEST, sequence_dataset, tiny_model  # noqa: E402

from adloco_hf import AdLoCoConfig, AdLoCoTrainer  # noqa: E402


def attempt(spec: dict, item: dict) -> dict:
    # the norm test's requests unless the item names a target (NORM_TEST in tests/helpers.py: they repeat)
    config = {"use_cpu": True, "report_to": [], "disable_tqdm": True, "log_level": "warning",
              **NORM_TEST, **item["config"]}  # fmt: skip
    args = AdLoCoConfig(**config)
    assert dist.is_initialized() and dist.get_world_size() == spec["world_size"], dist.get_world_size()
    model_config = dict(item.get("model", {}))
    if item.get("dropout"):
        model_config["attention_dropout"] = item["dropout"]
    trainer = AdLoCoTrainer(model=tiny_model(**model_config), args=args, train_dataset=sequence_dataset(512))
    try:
        trainer.train(resume_from_checkpoint=item["checkpoint"])
    except Exception as error:  # noqa: BLE001 - what the user would see is the result
        kind = {"type": type(error).__name__, "value_error": isinstance(error, ValueError)}
        return {"accepted": False, **kind, "message": str(error)}
    return {"accepted": True, "world_size": dist.get_world_size()}


def main() -> None:
    spec = json.loads(sys.argv[1])
    os.makedirs(spec["probe_dir"], exist_ok=True)
    for item in spec["attempts"]:
        result = attempt(spec, item)
        rank = dist.get_rank()
        with open(os.path.join(spec["probe_dir"], f"{item['name']}-rank{rank}.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
