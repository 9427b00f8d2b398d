"""One worker of the outer step's round-quorum test (`tests/quorum/test_round_quorum.py`): the same outer steps of
DiLoCo (`GlobalModel.outer_step`: pseudo-gradient, bf16 all-reduce weighted by samples, Nesterov outer SGD) run twice
from the same weights, over today's gloo group of every worker and over the round quorum's group (`agree`).

    python quorum_outer_worker.py '{"worker_id": 0, "workers": 3, "port": 29600, "lighthouse": "http://...",
                                    "rounds": 3, "out": "DIR", "today": true, "die_at_round": null}'

`today`: false skips the run over today's group. Each round every worker moves θ by its own seeded noise (its "inner steps"). `die_at_round`: this worker exits
right after joining that round's quorum, without averaging (the quorum run only). Writes `{out}/outer{id}.json`: per
round of each run, φ, and whether the round was skipped.
"""

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from adloco_hf.outer.step import GlobalModel
from adloco_hf.quorum import RoundQuorum


def make_model() -> tuple[list[torch.Tensor], GlobalModel]:
    torch.manual_seed(0)
    params = [torch.randn(37), torch.randn(5, 7)]
    return params, GlobalModel(params, device=torch.device("cpu"), lr=0.7, momentum=0.9, nesterov=True)


def train(params: list[torch.Tensor], worker_id: int, round_number: int) -> None:
    noise = torch.Generator().manual_seed(1000 * worker_id + round_number)
    for p in params:
        p.add_(torch.randn(p.shape, generator=noise), alpha=0.01 * (worker_id + 1))


def main(spec: dict) -> None:
    worker_id, workers, rounds = spec["worker_id"], spec["workers"], spec["rounds"]
    share = (worker_id + 1) / sum(range(1, workers + 1))  # its samples' share: the weighted mean
    results = {"world_size": None, "today": [], "quorum": [], "members": []}
    if spec.get("today", True):
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=worker_id, world_size=workers,
            timeout=timedelta(seconds=60),
        )  # fmt: skip
        results["world_size"] = dist.get_world_size()
        params, model = make_model()
        for r in range(rounds):
            train(params, worker_id, r)
            result = model.outer_step(group=dist.group.WORLD, num_workers=workers, weight=share)
            results["today"].append({"phi": model.phi.tolist(), "skipped": result.skipped})
        dist.destroy_process_group()
    quorum = RoundQuorum(
        worker_id, lighthouse=spec["lighthouse"], state_dict=dict, load_state_dict=lambda state: None, timeout=20.0
    )
    params, model = make_model()
    members = quorum.begin_round(wait_for=workers)
    for r in range(rounds):
        if r > 0:
            members = quorum.begin_round()
        if r == spec.get("die_at_round"):
            os._exit(0)
        train(params, worker_id, r)
        weight = share if members.size == workers else (worker_id + 1) / sum(w + 1 for w in members.workers)
        result = model.outer_step(group=members.group, num_workers=members.size, weight=weight, agree=quorum.agree)
        results["quorum"].append({"phi": model.phi.tolist(), "skipped": result.skipped})
        results["members"].append(list(members.workers))
    with open(os.path.join(spec["out"], f"outer{worker_id}.json"), "w") as f:
        json.dump(results, f)
    quorum.shutdown()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
