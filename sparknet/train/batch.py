"""The global batch as the recipe: GLOBAL_BATCH_SIZE blocks per optimizer step over all devices, whatever their
count, as LitGPT (`global_batch_size`, `micro_batch_size`) and torchtitan (global and local batch) do.

BATCH_SIZE is the per-device micro-batch: it sizes memory, not the optimisation. The accumulation follows from the
device count, so the same command on 1, 2 or 64 devices trains the same optimizer steps on the same tokens per step
with the same LR at every step, and evaluates and saves at the same steps.

`GlobalBatchSampler` makes a packed run's blocks per optimizer step independent of the device count too: each epoch
is a permutation of the blocks cut to whole global batches, and accelerate hands consecutive micro-batches to the
ranks in turn, so optimizer step s trains on positions [s*G, (s+1)*G) of the epoch's permutation on any number of
devices. Written here because the Trainer's own sampler (accelerate's SeedableRandomSampler, the same permutation)
keeps the epoch's last partial global batch, which is split and padded differently on each device count; that
made a resume on another count train other blocks from the first epoch boundary on.

A dataset built in phases (config "phases") is drawn phase by phase instead: the run's steps are divided among the
phases by their shares (`phase_ends`, at whole steps), and phase k's steps take permutations of phase k's blocks
only, cut to whole global batches as above (another permutation for each pass when a phase needs more blocks than it
holds, the first of one permutation when fewer). The whole run is one "epoch" of `max_steps` global batches, so a
resume anywhere, across a boundary included, replays the same order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import TrainerCallback

from sparknet.common.errors import UserError


@dataclass(frozen=True)
class BatchPlan:
    """How GLOBAL_BATCH_SIZE blocks are trained in one optimizer step on this many devices."""

    global_batch: int  # blocks per optimizer step, all devices together
    micro: int  # blocks per device per forward/backward
    accum: int  # micro-steps per optimizer step
    devices: int
    note: str = ""  # why the micro-batch is not BATCH_SIZE, when it is not


def plan_batch(global_batch: int, batch_size: int, devices: int) -> BatchPlan:
    """The micro-batch and accumulation that train `global_batch` blocks per step on `devices` devices with
    micro-batches of at most `batch_size`; one UserError where the global batch cannot be split so."""
    if global_batch % devices:
        below, above = global_batch - global_batch % devices, global_batch + devices - global_batch % devices
        raise UserError(f"GLOBAL_BATCH_SIZE={global_batch} blocks do not split evenly over {devices} devices: use a "
                        f"multiple of {devices} (e.g. {below or above} or {above}), or another number of devices")
    share = global_batch // devices
    note = ""
    micro = batch_size
    if batch_size > share:
        micro = share
        note = (f"BATCH_SIZE={batch_size} is more than a device's share of the global batch ({global_batch} blocks / "
                f"{devices} device(s) = {share}): micro-batches of {share}")
    elif share % batch_size:
        fits = max(d for d in range(1, batch_size + 1) if share % d == 0)
        raise UserError(f"BATCH_SIZE={batch_size} does not divide a device's share of the global batch "
                        f"(GLOBAL_BATCH_SIZE={global_batch} / {devices} device(s) = {share} blocks): use a BATCH_SIZE "
                        f"that divides {share}, e.g. {fits}")
    return BatchPlan(global_batch, micro, share // micro, devices, note)


def budget(target_tokens: int, block: int, global_batch: int) -> tuple[int, int]:
    """(optimizer steps, tokens per step) for a token budget: steps = ceil(target / (global batch x block))."""
    per_step = block * global_batch
    return math.ceil(target_tokens / per_step), per_step


def check_enough_blocks(blocks: int, global_batch: int) -> None:
    """A dataset must hold one whole global batch: every optimizer step trains on exactly `global_batch` blocks."""
    if blocks < global_batch:
        raise UserError(f"the dataset has {blocks} training blocks, fewer than one global batch "
                        f"(GLOBAL_BATCH_SIZE={global_batch}): lower GLOBAL_BATCH_SIZE, or build the dataset with "
                        "more tokens")


class GlobalBatchSampler(torch.utils.data.Sampler[int]):
    """Each epoch, a permutation of the blocks (seed + epoch, as accelerate's seedable sampler draws it) cut to
    whole global batches: the blocks beyond the last whole one are left out of this epoch only (the next epoch's
    permutation is another)."""

    def __init__(self, blocks: int, global_batch: int, seed: int,
                 phases: list[tuple[int, int, int]] | None = None) -> None:
        """`phases`: (first block, end block, steps) of each phase, for a dataset built in phases."""
        check_enough_blocks(blocks, global_batch)
        for start, end, steps in phases or ():
            if steps:
                check_enough_blocks(end - start, global_batch)
        self.blocks, self.global_batch, self.seed = blocks, global_batch, seed
        self.phases = phases
        self.epoch = 0

    def __len__(self) -> int:
        if self.phases is not None:
            return sum(steps for _, _, steps in self.phases) * self.global_batch
        return self.blocks // self.global_batch * self.global_batch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.phases is not None:
            yield from self._phased()
            return
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.blocks, generator=generator)[:len(self)].tolist()

    def _phased(self) -> Iterator[int]:
        """Each phase's steps from its own blocks: pass p over phase k is a permutation seeded by (seed, k, p)."""
        assert self.phases is not None
        for k, (start, end, steps) in enumerate(self.phases):
            wanted, passes = steps * self.global_batch, 0
            per_pass = (end - start) // self.global_batch * self.global_batch
            while wanted > 0:
                generator = torch.Generator()
                generator.manual_seed(self.seed + 1_000_003 * (k + 1) + passes)
                order = (torch.randperm(end - start, generator=generator)[:min(per_pass, wanted)] + start).tolist()
                yield from order
                wanted -= len(order)
                passes += 1


class TokenCount(TrainerCallback):
    """Counts the tokens trained, step by step, in the Trainer's own `num_input_tokens_seen` (saved in every
    checkpoint's trainer_state.json and restored on resume): the metadata's `tokens_seen` is then what was trained
    even where ALLOW_CONFIG_CHANGE changed the global batch between attempts. Not the Trainer's own count
    (`include_num_input_tokens_seen`), which gathers across processes and reads the device at every micro-step."""

    def __init__(self, tokens_per_step: int) -> None:
        self.tokens_per_step = tokens_per_step

    def on_step_end(self, args: object, state: object, control: object, **kw: object) -> None:
        state.num_input_tokens_seen += self.tokens_per_step
