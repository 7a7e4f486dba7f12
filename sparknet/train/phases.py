"""A run in phases (config "phases") as the trainers show it: which phase an optimizer step is in, and the
`data/phase` figure in TensorBoard, so that a curve's change at a boundary can be read against the phase. Where the
phases' steps end is `DataPlan.plan_phases`'s; the packed sampler and the stream switch there."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback


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
