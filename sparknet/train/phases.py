"""A run in phases (config "phases") as the trainers show it: which phase an optimizer step is in, and the
`data/phase` figure in TensorBoard, so that a curve's change at a boundary can be read against the phase. Where the
phases' steps end is `DataPlan.plan_phases`'s; the packed sampler and the stream switch there."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from transformers import TrainerCallback

from sparknet.common.errors import UserError
from sparknet.config.mix import phase_ends


def check_every_phase_trains(phases: Sequence[tuple[str, float]], max_steps: int, tokens_per_step: int) -> list[int]:
    """Where each phase's optimizer steps end (`phase_ends` of the shares), or one UserError, before any work, when
    a phase gets none: its share of the run's steps rounds to zero. Such a phase never happened (its mix untrained,
    "anneal steps 6-5" in the log) and, with LR_SCHEDULE=wsd, the decay over the last phase never ran either."""
    shares = [share for _, share in phases]
    ends = phase_ends(shares, max_steps)
    empty = [phases[k][0] for k in _empty_phases(shares, max_steps)]
    if not empty:
        return ends
    # the fewest steps that give every phase one (a phase of share s has one from about 2/s steps on)
    enough = next(steps for steps in itertools.count(max_steps + 1) if not _empty_phases(shares, steps))
    also = f" (nor does {', '.join(empty[1:])})" if empty[1:] else ""
    raise UserError(
        f"phase {empty[0]} gets none of the run's {max_steps} optimizer steps (its share, "
        f"{dict(phases)[empty[0]]:g} of them, rounds to none){also}: train at least {enough} steps "
        f"(MAX_STEPS={enough}, or TARGET_TOKENS={enough * tokens_per_step:,} at {tokens_per_step:,} tokens a step), "
        "or give the phase a larger share in the config")


def _empty_phases(shares: Sequence[float], steps: int) -> list[int]:
    """The phases (0-based) that `steps` optimizer steps, divided by `shares`, leave without a step."""
    ends = phase_ends(shares, steps)
    return [k for k, end in enumerate(ends) if end == (ends[k - 1] if k else 0)]


def phase_at(ends: list[int], step: int) -> int:
    """The phase (0-based) that optimizer step `step` (1-based; 0: before the first) is in, given where each phase's
    steps end."""
    return next((k for k, end in enumerate(ends) if step <= end), len(ends) - 1)


class PhaseCallback(TrainerCallback):
    """Writes the current phase (`data/phase`, 0-based) at each logging step of a run in phases."""

    def __init__(self, *, writer: Any, ends: list[int]) -> None:
        self.writer, self.ends = writer, ends

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any) -> None:
        if logs and "loss" in logs and state.is_world_process_zero:
            self.writer.add_scalar("data/phase", phase_at(self.ends, state.global_step), state.global_step)
