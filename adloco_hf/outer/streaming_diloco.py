"""Streaming DiLoCo's outer step (Douillard et al., 2025, arXiv 2501.18512): fragments of φ synced on a staggered
schedule, each all-reduce overlapped with τ inner steps, the average mixed with the local weights by α.

`StreamingSync` belongs to one `GlobalModel` (`GlobalModel.streaming`, made when `num_fragments` is set) and uses its
φ, its outer SGD's settings and momentum buffer (one flat buffer: fragment p's outer optimizer state is its slice,
stepped only when p syncs), its all-reduce's settings and its place among the worker's processes. The schedule is
`fragments.py`'s. The worker calls it after every inner step (`after_step`: the average due, then the fragment due)
and at the round's end (`end_round`: fragment 0); each call runs on every worker of the instance at the same step,
so the collectives pair up. One average at most is in flight, on the outer step's own process groups (an async
all-reduce, or a compressed ring on its own thread, `reduce.py`), while the inner steps go on.

A fragment's sync, on every worker of the instance alike:

1. send, after inner step s: Δ_p = φ_p − θ_p (float32, a new tensor) into the all-reduce; φ_p stays as it was.
2. apply, after inner step s + τ: wait for the mean; a finite one steps φ_p with the outer SGD (the same arithmetic
   as `torch.optim.SGD`'s, on φ_p's slice of the momentum) and sets θ_p ← (1 − α) φ_p + α θ_p (θ_p: the weights that
   trained on meanwhile; α = 0 copies φ_p). A non-finite mean leaves φ_p as it was and puts θ ← φ for the whole
   model (the round is reported skipped; the worker cleans its inner optimizer): a NaN would otherwise come back
   through the fragments not yet synced.

Each fragment keeps its own error-feedback residual (the same fragment goes through the ring every round). Between
syncs every worker's θ differs from φ (the fragments train on locally), so a checkpoint saves this process's θ, the
average in flight (waited for, unapplied, with the step it is due) and the round's running figures: a resumed run
continues exactly. `settle` applies the average in flight at once (with `drop_local`, an elastic resume, θ ← φ too);
`flush` also syncs, blocking, every fragment whose weights moved since it was sent, so that a merge and the end of
training use every token (every fragment is synced there).
"""

import math
import time
from dataclasses import dataclass, field

import torch

from ..common.layout import part_range
from .fragments import fragment_pieces, fragment_ranges, fragments_sent_at
from .reduce import PendingMean, PseudoGradReduce


__all__ = ["FragmentTally", "StreamingSync"]


@dataclass
class FragmentTally:
    """What this worker's fragment syncs did in the current round (the round end reports it, then starts afresh)."""

    norms: list[float] = field(default_factory=list)  # ‖mean‖ of each average applied (whole fragment)
    payload_bytes: int = 0  # this process's contribution to the rounds' all-reduces (0 for a worker alone)
    seconds: float = 0.0  # the training thread's time in sends and applies (waiting for averages included)
    skipped: bool = False  # an average applied this round was not finite
    local_sq_norm: float = 0.0  # Σ ‖Δ_p‖² of this worker's fragments applied this round

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("norms", "payload_bytes", "seconds", "skipped", "local_sq_norm")}


@dataclass
class _InFlight:
    fragment: int
    apply_step: int
    pending: PendingMean
    local_sq: float  # ‖Δ_p‖² of this process's whole fragment
    part: tuple[int, int] | None  # processes_per_worker > 1 (DDP): the slice of the fragment this process reduced


class StreamingSync:
    """The fragments of one `GlobalModel`, their schedule, the average in flight and the round's tally.

    Args:
        model: the `GlobalModel` whose φ is synced in fragments (its `part` and `split` are read at each sync, so
            `split_over` / `shard_over` may come after).
        num_fragments: P.
        delay: τ, inner steps between sending a fragment and applying its average.
        alpha: α, the weight of the local weights when an average is applied.
    """

    def __init__(
        self,
        model,
        *,
        num_fragments: int,
        delay: int,
        alpha: float,
        positions: tuple[list[int], int] | None = None,
    ):
        if delay < 0 or not 0.0 <= alpha <= 1.0:
            raise ValueError(f"fragment_sync_delay={delay} must be >= 0 and fragment_update_alpha={alpha} in [0, 1]")
        self.model = model
        self.num_fragments = num_fragments
        self.delay = delay
        self.alpha = alpha
        self._offsets = [0]
        for p in model.params:
            self._offsets.append(self._offsets[-1] + p.numel())
        # Each fragment as pieces of this process's φ: one range each when it holds the whole model, the parts of
        # the whole model's fragments in its shards otherwise (`fragments.fragment_pieces`).
        starts, total = positions if positions is not None else (self._offsets[:-1], model.numel)
        sizes = [p.numel() for p in model.params]
        self.pieces = fragment_pieces(starts, sizes, fragment_ranges(total, num_fragments))
        self.sizes = [sum(b - a for a, b in pieces) for pieces in self.pieces]
        template = model.reduce
        self.reduces = [
            PseudoGradReduce(template.compression, dtype=template.dtype, block_size=template.block_size)
            for _ in self.pieces
        ]
        self.in_flight: _InFlight | None = None
        self.last_sent = [0] * num_fragments  # the step each fragment was last sent (for `flush`)
        self.tally = FragmentTally()
        # (step, fragment) of every send and every average applied by this process (what the tests' probes read)
        self.sent: list[tuple[int, int]] = []
        self.applied: list[tuple[int, int]] = []
        self.step = 0  # the last inner step this process synced after
        self._saved_local: torch.Tensor | None = None  # θ from a checkpoint, written by `restore_params`

    # ---- θ over a range of the flat model ----
    def _pieces(self, a: int, b: int):
        """(parameter, its flat slice [i, j), the range's slice [i + off − a, …)) for the parameters in [a, b)."""
        for param, start, end in zip(self.model.params, self._offsets[:-1], self._offsets[1:]):
            if end <= a or start >= b:
                continue
            i, j = max(a, start), min(b, end)
            yield param, i - start, j - start, i - a, j - a

    @torch.no_grad()
    def _read(self, a: int, b: int) -> torch.Tensor:
        """θ[a:b], float32 on φ's device (a new tensor)."""
        out = torch.empty(b - a, dtype=torch.float32, device=self.model.device)
        for param, i, j, x, y in self._pieces(a, b):
            out[x:y].copy_(param.detach().reshape(-1)[i:j])
        return out

    @torch.no_grad()
    def _write(self, a: int, b: int, values: torch.Tensor) -> None:
        """θ[a:b] ← values (cast to the parameters' dtype and device; parameters are written in place)."""
        for param, i, j, x, y in self._pieces(a, b):
            param.detach().view(-1)[i:j].copy_(values[x:y])

    def _spans(self, fragment: int):
        """(a, b, x, y): piece [a, b) of this process's φ holds elements [x, y) of fragment `fragment`'s values."""
        x = 0
        for a, b in self.pieces[fragment]:
            yield a, b, x, x + b - a
            x += b - a

    def _phi(self, fragment: int) -> torch.Tensor:
        """φ over the fragment's pieces (a view when it is one piece)."""
        phi = self.model.phi.detach()
        spans = list(self._spans(fragment))
        if len(spans) == 1:
            return phi[spans[0][0] : spans[0][1]]
        return torch.cat([phi[a:b] for a, b, _, _ in spans]) if spans else phi[:0]

    def _theta(self, fragment: int) -> torch.Tensor:
        """θ over the fragment's pieces, float32 (a new tensor)."""
        out = torch.empty(self.sizes[fragment], dtype=torch.float32, device=self.model.device)
        for a, b, x, y in self._spans(fragment):
            out[x:y] = self._read(a, b)
        return out

    def _set_theta(self, fragment: int, values: torch.Tensor) -> None:
        for a, b, x, y in self._spans(fragment):
            self._write(a, b, values[x:y])

    # ---- the schedule ----
    def after_step(self, step: int, *, offset: int, inner_steps: int, group, num_workers: int) -> bool:
        """After inner step `step` (offset `offset` of a round of `inner_steps`): apply the average due, then send
        the fragment due (p ≥ 1; fragment 0 is `end_round`'s). Returns whether an average applied was skipped."""
        self.step = step
        skipped = self._apply_due(step)
        for fragment in fragments_sent_at(offset, self.num_fragments, inner_steps):
            skipped |= self.send(fragment, step, group=group, num_workers=num_workers)
        return skipped

    def end_round(self, step: int, *, group, num_workers: int):
        """The round's end: send fragment 0 (applied at once when τ = 0), then report the round and start a new one.
        Returns (the round's `FragmentTally`, whether fragment 0's average was skipped now)."""
        self.step = step
        skipped = self.send(0, step, group=group, num_workers=num_workers)
        tally, self.tally = self.tally, FragmentTally()
        return tally, skipped

    def _apply_due(self, step: int) -> bool:
        if self.in_flight is None or self.in_flight.apply_step != step:
            return False
        return self.apply(step)

    # ---- one fragment's send and apply ----
    @torch.no_grad()
    def send(self, fragment: int, step: int, *, group, num_workers: int) -> bool:
        """Start the average of fragment `fragment`'s Δ (and apply it now when τ = 0). Returns whether an average
        applied here was skipped."""
        if self.in_flight is not None:  # the schedule never allows it (τ ≤ ⌊H/P⌋); a settle would have cleared it
            raise RuntimeError(
                f"fragment {fragment} is due at step {step} while fragment {self.in_flight.fragment}'s average is "
                "still in flight"
            )
        started = time.perf_counter()
        model = self.model
        size = self.sizes[fragment]
        delta = self._phi(fragment) - self._theta(fragment)
        local_sq = float(torch.dot(delta, delta))
        part, sent = None, size
        reduce = self.reduces[fragment]
        if num_workers > 1 and model.part is not None:
            part = part_range(size, model.split.parts, model.split.local_rank)
            sent = part[1] - part[0]
            pending = reduce.start(delta[part[0] : part[1]], group, num_workers, background=True)
        else:
            pending = reduce.start(delta, group, num_workers, background=True)
        self.in_flight = _InFlight(fragment, step + self.delay, pending, local_sq, part)
        self.last_sent[fragment] = step
        self.sent.append((step, fragment))
        self.tally.payload_bytes += reduce.payload_bytes(sent, num_workers)
        self.tally.seconds += time.perf_counter() - started
        return self.apply(step) if self.delay == 0 else False

    @torch.no_grad()
    def apply(self, step: int) -> bool:
        """Wait for the average in flight and apply it (module docstring); returns whether it was skipped."""
        started = time.perf_counter()
        flight, self.in_flight = self.in_flight, None
        model = self.model
        fragment = flight.fragment
        mean = flight.pending.wait().to(model.device, torch.float32)
        if flight.part is not None:
            mean = model.split.gather(mean, self.sizes[fragment]).to(model.device)
        norm, local_sq = model.split.whole_norms(float(torch.linalg.vector_norm(mean)), flight.local_sq, model.device)
        skipped = not math.isfinite(norm)
        if skipped:
            model.copy_to_params()  # θ ← φ everywhere: no non-finite value stays in the local weights
        else:
            self._outer_sgd(fragment, mean)
            phi = self._phi(fragment)
            self._set_theta(fragment, phi if self.alpha == 0 else phi.lerp(self._theta(fragment), self.alpha))
        self.tally.norms.append(norm)
        self.tally.local_sq_norm += local_sq
        self.tally.skipped |= skipped
        self.tally.seconds += time.perf_counter() - started
        self.applied.append((step, fragment))
        return skipped

    def _outer_sgd(self, fragment: int, mean: torch.Tensor) -> None:
        """φ_p ← one step of the outer SGD with gradient `mean`: `torch.optim.SGD`'s arithmetic (dampening 0) on the
        fragment's slice of the model's momentum buffer. A zero buffer steps exactly like SGD's first-step copy of
        the gradient, so the buffer is made whole (zeros) at the first sync of any fragment."""
        model = self.model
        group = model.optimizer.param_groups[0]
        lr, momentum, nesterov = group["lr"], group["momentum"], group["nesterov"]
        state = model.optimizer.state[model.phi]
        if momentum > 0 and state.get("momentum_buffer") is None:
            state["momentum_buffer"] = torch.zeros_like(model.phi.detach())
        for a, b, x, y in self._spans(fragment):
            gradient, step = mean[x:y], mean[x:y]
            if momentum > 0:
                buffer = state["momentum_buffer"][a:b]
                buffer.mul_(momentum).add_(gradient)
                step = gradient.add(buffer, alpha=momentum) if nesterov else buffer
            model.phi.detach()[a:b].add_(step, alpha=-lr)

    # ---- merges, the end of training, resume ----
    def settle(self, *, drop_local: bool = False) -> bool:
        """Apply the average in flight now; with `drop_local` also θ ← φ (an elastic resume: the workers of the
        instance then agree). Returns whether the average was skipped."""
        skipped = False
        if self.in_flight is not None:
            skipped = self.apply(self.step)
        if drop_local:
            self.model.copy_to_params()
        return skipped

    def flush(self, step: int, *, group, num_workers: int) -> FragmentTally:
        """Every fragment synced: apply the average in flight, then sync at once (τ = 0, blocking) every fragment
        whose local weights trained on since it was sent, and put θ ← φ, so that φ holds every step's work (a merge,
        the end of training). Returns what it did as its own `FragmentTally` (this process's payload bytes, seconds,
        whether an average was skipped); the round's tally is left as it was."""
        self.step = step
        kept, self.tally = self.tally, FragmentTally()
        delay, self.delay = self.delay, 0
        try:
            self.settle()
            for fragment in range(self.num_fragments):
                if self.last_sent[fragment] < step:
                    self.send(fragment, step, group=group, num_workers=num_workers)
        finally:
            self.delay = delay
            done, self.tally = self.tally, kept
        self.model.copy_to_params()
        return done

    def reset_error_feedback(self) -> None:
        for reduce in self.reduces:
            reduce.reset_error_feedback()

    def state_dict(self) -> dict:
        """The schedule's position, the average in flight (waited for, unapplied), this process's θ, the round's
        tally and every fragment's residual."""
        flight = self.in_flight
        if flight is not None:
            flight = {
                "fragment": flight.fragment,
                "apply_step": flight.apply_step,
                "mean": flight.pending.wait().detach().cpu().clone(),
                "local_sq": flight.local_sq,
                "part": None if flight.part is None else list(flight.part),
            }
        return {
            "num_fragments": self.num_fragments,
            "last_sent": list(self.last_sent),
            "in_flight": flight,
            "local": self._read(0, self.model.numel).cpu(),
            "tally": self.tally.state_dict(),
            "error_feedback": [reduce.state_dict() for reduce in self.reduces],
        }

    def load_state_dict(self, state: dict | None) -> None:
        """Restore what `state_dict` saved (None: a checkpoint of blocking DiLoCo, whose θ is φ); θ is written by
        `restore_params`, once the parameters hold what the Trainer loaded."""
        self.in_flight, self._saved_local = None, None
        self.tally = FragmentTally()
        self.reset_error_feedback()
        if state is None:
            return
        if state["num_fragments"] != self.num_fragments:
            raise ValueError(
                f"the checkpoint was written with num_fragments={state['num_fragments']}, this run has "
                f"{self.num_fragments}: resume with num_fragments={state['num_fragments']}"
            )
        self.last_sent = [int(s) for s in state["last_sent"]]
        self.step = max(self.last_sent)
        flight = state["in_flight"]
        if flight is not None:
            mean = flight["mean"].to(self.model.device, torch.float32)
            part = None if flight["part"] is None else tuple(flight["part"])
            self.in_flight = _InFlight(
                flight["fragment"], flight["apply_step"], PendingMean.done(mean), flight["local_sq"], part
            )
        self._saved_local = state["local"]
        self.tally = FragmentTally(**state["tally"])
        for reduce, saved in zip(self.reduces, state["error_feedback"]):
            reduce.load_state_dict(saved)

    @torch.no_grad()
    def restore_params(self) -> None:
        """θ as the checkpoint left it: this process's own weights (φ when the checkpoint had none)."""
        if self._saved_local is None:
            self.model.copy_to_params()
        else:
            self._write(0, self.model.numel, self._saved_local.to(self.model.device, torch.float32))
            self._saved_local = None
