"""The safety net of a run: a clean stop on SIGINT/SIGTERM/SIGHUP (checkpoint first), a stop on a non-finite loss or
grad norm (nothing saved after it), checkpoints marked complete only when every process has written its part, and under
data parallelism one decision for all processes."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from sparknet.common.runtime import follow_umask, quiet_closed_terminal
from sparknet.tokenizer import portable_config
from sparknet.train.folders import mark_complete

log = logging.getLogger("sparknet.train")


# what asks a run to stop: Ctrl-C, a stop from outside (timeout, systemd, Slurm), the terminal or SSH session closed
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class SafetyCallback(TrainerCallback):
    """Stops cleanly on SIGINT/SIGTERM/SIGHUP (saving a checkpoint first) and on a non-finite loss or grad norm (saving
    nothing, so the last good checkpoint stays the latest); marks each checkpoint complete once every process has
    written its part; logs at the last step and at a stop, so no step's loss or grad norm goes unlogged.

    Under data parallelism the processes must stop at the same step. At every step each process contributes its
    signal flag to an all-reduce on a CPU (gloo) group, started asynchronously and read one step later, so a stop
    comes within two steps without a device synchronisation; the non-finite check, which reads the device, is
    agreed on at logging, eval and save steps, where the Trainer synchronises anyway.
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.stop_signal: int | None = None
        self.diverged_at: int | None = None
        self._group: Any = None
        self._pending: tuple[Any, Any] | None = None  # (work, buffer) of the all-reduce started last step

    def request_stop(self, signum: int) -> None:
        self.stop_signal = signum

    @staticmethod
    def _distributed() -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        import torch.distributed as dist

        if self._distributed() and self._group is None:  # a collective: every process creates it here
            from datetime import timedelta

            timeout = timedelta(seconds=args.ddp_timeout)  # the default group's, from the Trainer's arguments
            self._group = (dist.group.WORLD if dist.get_backend() == "gloo"
                           else dist.new_group(backend="gloo", timeout=timeout))

    @property
    def group(self) -> Any:
        """The CPU (gloo) process group of the run's agreements, from the start of training; None on one process."""
        return self._group

    def _agreed_stop(self) -> int | None:
        """The stop signal any process had at the previous step; starts this step's all-reduce."""
        import torch
        import torch.distributed as dist

        agreed = None
        if self._pending is not None:
            work, buffer = self._pending
            work.wait()
            agreed = int(buffer[0]) or None
        buffer = torch.tensor([self.stop_signal or 0], dtype=torch.int64)
        self._pending = (dist.all_reduce(buffer, op=dist.ReduceOp.MAX, group=self._group, async_op=True), buffer)
        return agreed

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        import torch
        import torch.distributed as dist

        distributed = self._distributed()
        last = state.global_step >= state.max_steps
        at_sync_point = control.should_log or control.should_save or control.should_evaluate or last
        stop = self._agreed_stop() if distributed else self.stop_signal
        bad = None
        if self.trainer.nonfinite == "stop" and (at_sync_point or stop is not None):
            bad = self.trainer.first_nonfinite_step()
            if distributed:  # every process reads its device here, so all of them take part
                flags = torch.tensor([-1 if bad is None else bad], device=args.device)
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
                bad = None if int(flags[0]) < 0 else int(flags[0])
        if bad is not None:
            self.diverged_at = bad
            control.should_training_stop = True
            control.should_save = False
            control.should_evaluate = False
        elif stop is not None:
            self.stop_signal = stop
            control.should_save = True
            control.should_training_stop = True
        if last or control.should_training_stop:
            control.should_log = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        import torch.distributed as dist

        if self._distributed():
            dist.barrier(group=self._group)  # every process has written its part (its RNG state) of the checkpoint
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                follow_umask(folder)  # safetensors writes 0600; before the marker, which vouches for the files
                if (folder / "tokenizer_config.json").is_file():  # as the run folder's (sparknet.tokenizer's rule)
                    portable_config(folder)
                mark_complete(folder, state.global_step)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None


@contextmanager
def stop_on_signals(safety: SafetyCallback) -> Iterator[None]:
    """While training: SIGINT/SIGTERM/SIGHUP ask for a checkpoint and a clean stop; a second signal aborts.

    Under torchrun a Ctrl-C reaches each worker twice (from the terminal, then forwarded by torchrun), so repeats
    within a few seconds of the first count as the same request there."""
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    first_at: list[float] = []
    grace = 5.0 if "TORCHELASTIC_RUN_ID" in os.environ else 0.0

    def on_signal(signum: int, _frame: Any) -> None:
        now = time.monotonic()
        if first_at and now - first_at[0] <= grace:
            return
        if first_at:
            _restore(previous)
            signal.raise_signal(signum)
            return
        first_at.append(now)
        if signum == signal.SIGHUP:
            quiet_closed_terminal()
        log.warning("received %s: saving a checkpoint at the end of this step, then stopping (again to abort)",
                    signal.Signals(signum).name)
        safety.request_stop(signum)

    with _handled_by(on_signal, previous):
        yield


class Interrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP during work that cannot stop half way cleanly (the final eval and export)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """While the final model is written: SIGINT/SIGTERM/SIGHUP raise `Interrupted`, so the run ends with a line saying
    what happened and what to do (the default SIGTERM ends the process without a word)."""
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}

    def on_signal(signum: int, _frame: Any) -> None:
        _restore(previous)  # a second signal acts as it would have
        raise Interrupted(signum)

    with _handled_by(on_signal, previous):
        yield


@contextmanager
def _handled_by(handler: Callable[[int, Any], None], previous: dict[int, Any]) -> Iterator[None]:
    """`handler` for the signals of `previous` while the block runs; their previous handlers after it."""
    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        _restore(previous)


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
