"""One worker of the round-quorum tests (`tests/quorum/test_round_quorum.py`): a torchft replica group of one
process that runs rounds of weighted averages through `RoundQuorum`.

    python quorum_worker.py '{"worker_id": 0, "lighthouse": "http://...", "rounds": 6, "out": "DIR", "holds": [2]}'

Its state is φ (a vector) and the rounds it committed. Each round it contributes φ + (worker_id + 1) with weight
worker_id + 1; a committed round's average becomes φ. A worker that heals takes a peer's φ and round number. After
committing round r it writes a line to `{out}/worker{id}.jsonl` (the round number, the members, φ, healed, the
workers whose reports it gathered, its pid),
and where r is in `holds` it waits for the file `{out}/go{r}` before the next round. It stops after the first round
r >= `rounds` that had `workers` members (its first round waits for them), pausing `pause` seconds between rounds (as training would).
"""

import json
import os
import sys
import time

import torch

from adloco_hf.quorum import RoundQuorum


def main(spec: dict) -> None:
    worker_id, out = spec["worker_id"], spec["out"]
    state = {"phi": torch.zeros(4)}

    def load(received: dict) -> None:
        state["phi"] = received["phi"].clone()

    quorum = RoundQuorum(
        worker_id,
        lighthouse=spec["lighthouse"],
        state_dict=lambda: {"phi": state["phi"].clone()},
        load_state_dict=load,
        min_workers=spec.get("min_workers", 1),
        timeout=spec.get("timeout", 30.0),
    )
    log = open(os.path.join(out, f"worker{worker_id}.jsonl"), "a")
    wait_for = spec["workers"]  # the first round waits for the whole job (a returning worker: for its peers too)
    while True:
        members = quorum.begin_round(wait_for=wait_for)
        wait_for = 1
        contribution = state["phi"] + (worker_id + 1)
        average = quorum.weighted_average(contribution, weight=worker_id + 1)
        reports = quorum.gather({"worker": worker_id, "pid": os.getpid()})
        if not quorum.commit() or average is None or reports is None:
            continue  # a member died inside the round: every member drops it
        state["phi"] = average
        done = members.round_number + 1
        line = {"round": done, "members": list(members.workers), "phi": average.tolist(), "healed": members.healed}
        line["reports"] = [report["worker"] for report in reports]
        log.write(json.dumps({**line, "pid": os.getpid()}) + "\n")
        log.flush()
        if done >= spec["rounds"] and members.size == spec["workers"]:
            break
        if done in spec.get("holds", []):
            while not os.path.exists(os.path.join(out, f"go{done}")):
                time.sleep(0.05)
        time.sleep(spec.get("pause", 0.0))
    quorum.shutdown()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
