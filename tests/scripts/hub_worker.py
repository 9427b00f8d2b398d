"""A worker of `test_hub.py`: two instances that merge, `push_to_hub=True`, and a Hub whose uploads always fail.

Usage: accelerate launch --multi_gpu --num_processes 2 tests/scripts/hub_worker.py '{"output_dir": ..., "probe_dir": ...}'
Writes `probe_dir/report-rank{R}.json`: the step reached, the error `train()` raised, WARNING lines, upload tries.
"""

import json
import logging
import os
import sys

import torch.distributed as dist
from helpers import hub_http, sequence_dataset, tiny_model

import adloco_hf.reporting.hub as hub
from adloco_hf import AdLoCoConfig, AdLoCoTrainer


class UnreachableHub:
    """Repos can be created, but every upload fails as it does without a network."""

    def __init__(self):
        self.uploads = 0

    def create_repo(self, repo_id, private=None, exist_ok=False, **kwargs):
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, **kwargs):
        self.uploads += 1
        raise hub_http.ConnectError("[Errno 111] Connection refused")


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def main() -> None:
    spec = json.loads(sys.argv[1])
    api = UnreachableHub()
    hub.get_hub_api = lambda token=None: api
    hub.PUSH_RETRY_SECONDS = 0.001
    warnings = Warnings()
    logging.getLogger("adloco_hf").addHandler(warnings)
    args = AdLoCoConfig(
        output_dir=spec["output_dir"], max_steps=20, inner_steps=5, num_instances=2, merge_every=1,
        per_device_train_batch_size=2, max_batch_size=4, use_cpu=True, report_to=[], disable_tqdm=True,
        save_strategy="no", push_to_hub=True, hub_model_id="me/adloco-tiny", log_level="warning",
    )  # fmt: skip
    assert dist.get_world_size() == 2
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(128))
    error = None
    try:
        trainer.train()
    except hub.HubUploadError as raised:
        error = {"type": type(raised).__name__, "folder": raised.folder, "message": str(raised)}
    report = {"global_step": trainer.state.global_step, "error": error, "warnings": warnings.lines}
    report["uploads"] = api.uploads
    os.makedirs(spec["probe_dir"], exist_ok=True)
    with open(os.path.join(spec["probe_dir"], f"report-rank{dist.get_rank()}.json"), "w") as f:
        json.dump(report, f)
    trainer.end()


if __name__ == "__main__":
    main()
