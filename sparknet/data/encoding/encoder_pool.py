"""Encoder processes shared by the packed build and the stream: one single-threaded `DocumentEncoder` per process.

`concurrent.futures.ProcessPoolExecutor`, not `multiprocessing.Pool`: when a worker dies (the system's out-of-memory
killer, a `kill -9`), Pool starts a replacement and waits forever for the batch the dead one held, so a build or a
training run hangs with no message; the executor breaks instead, and `EncoderDied` says what happened and what to do.

Details that keep a stop clean:
- Processes are spawned, not forked: a forked tokenizer with live threads can deadlock.
- The tokenizer reaches the workers through a file, not their start-up arguments: a spawn message larger than a
  pipe's buffer blocks the main process for good if the worker dies while reading it.
- Workers leave the main process's process group: a Ctrl-C in the terminal, or a SIGTERM to the group (`timeout`,
  systemd, Slurm), is for the main process, which stops cleanly (the trainer finishes its step and saves) and still
  needs its encoders to do so. They are spawned with SIGINT blocked until they have left it. SIGTERM is not
  blocked: it is also how the executor stops a worker, and a stop during a worker's start-up must not be lost (the
  executor would wait for that worker for good); a group SIGTERM in the second a worker starts still ends it.
- multiprocessing's resource tracker (a helper process that stays in the group) is started with SIGHUP ignored,
  as it ignores SIGINT and SIGTERM itself: a closed terminal stops the trainer cleanly, and the tracker, killed by
  it, was restarted and printed a traceback for the semaphores it no longer knew.
- Workers exit when the main process is gone (kill -9): unlike Pool's, the executor's workers hold their task
  queue's writing end, never see it close and would wait forever, orphaned.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np

from sparknet.common.errors import UserError
from sparknet.data.encoding.packer import DocumentEncoder

_BLOCKED_AT_START = {signal.SIGINT}


def _start_resource_tracker() -> None:
    """multiprocessing's resource tracker, started now (if it is not running) with SIGHUP ignored, which it keeps
    across its exec: it ignores SIGINT and SIGTERM itself, but a closed terminal's SIGHUP to the group killed it."""
    from multiprocessing import resource_tracker

    if threading.current_thread() is not threading.main_thread():  # signal.signal works on the main thread only
        resource_tracker.ensure_running()
        return
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, previous)


class EncoderDied(UserError):
    """An encoder process ended while the pipeline needed it."""

    def __init__(self, exit_codes: list[int]) -> None:
        # once one worker dies, the executor stops the others with SIGTERM: those are not the cause
        signals = [-c for c in exit_codes if c < 0 and -c != signal.SIGTERM]
        if signal.SIGKILL in signals:
            cause = "killed (SIGKILL), most often by the system when memory runs out: free memory or lower NUM_WORKERS"
        elif signals:
            cause = f"stopped by signal {signal.Signals(signals[0]).name}"
        elif any(c > 0 for c in exit_codes):
            cause = f"exited with status {next(c for c in exit_codes if c > 0)} (its messages are above)"
        elif exit_codes:
            cause = "stopped by signal SIGTERM"
        else:
            cause = "ended unexpectedly"
        super().__init__(f"an encoder process died: {cause}; then run the same command again: it goes on from its "
                         "last saved position")


_WORKER_ENCODER: DocumentEncoder | None = None


def _init_worker(tokenizer_file: str, eos_id: int, dtype: str, parent: int) -> None:
    global _WORKER_ENCODER
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # also discards a Ctrl-C pending since the start
    if hasattr(os, "setpgrp"):
        os.setpgrp()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _BLOCKED_AT_START)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the pool gives the parallelism
    _WORKER_ENCODER = DocumentEncoder(Path(tokenizer_file).read_text(encoding="utf-8"), eos_id, dtype)


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:  # a dead parent's children are handed to another process
        time.sleep(0.5)
    os._exit(1)


def _encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    assert _WORKER_ENCODER is not None, "_init_worker did not run"
    return _WORKER_ENCODER(texts)


@contextlib.contextmanager
def _ctrl_c_blocked() -> Iterator[None]:
    """Workers start (fork + exec) with the caller's signal mask: blocked here, a Ctrl-C cannot stop them before
    they have left the group. Held for the microseconds of a submit; a Ctrl-C then arrives after."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKED_AT_START)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Encoding:
    """One batch being encoded; `get()` waits for `(flat tokens, lengths)`."""

    def __init__(self, future: Future, pool: EncoderPool) -> None:
        self._future, self._pool = future, pool

    def get(self) -> tuple[np.ndarray, np.ndarray]:
        try:
            return self._future.result()
        except BrokenProcessPool as exc:
            raise self._pool.died() from exc


class EncoderPool:
    """`workers` encoder processes; `submit(texts)` starts encoding a batch."""

    def __init__(self, workers: int, tokenizer_json: str, eos_id: int, dtype: np.dtype) -> None:
        _start_resource_tracker()
        handle, self._tokenizer_file = tempfile.mkstemp(prefix="sparknet-tokenizer-", suffix=".json")
        with os.fdopen(handle, "w", encoding="utf-8") as f:
            f.write(tokenizer_json)
        self._executor = ProcessPoolExecutor(
            workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
            initargs=(self._tokenizer_file, eos_id, np.dtype(dtype).name, os.getpid()))
        # Every worker starts at the first submit, before the executor's manager thread does. By default (spawn)
        # the executor starts one per submit while that thread runs, and a start can race the thread's reading of
        # its process table: "RuntimeError: dictionary changed size during iteration" from get_n_children_alive, a
        # traceback seen on a loaded machine. No public setting: this is the executor's own flag for fork, under
        # which it starts them all first (tests/test_hf_private_apis.py pins it).
        self._executor._safe_to_dynamically_spawn_children = False
        self._processes: dict[int, Any] = {}

    def submit(self, texts: list[str]) -> Encoding:
        try:
            with _ctrl_c_blocked():
                future = self._executor.submit(_encode, texts)
        except BrokenProcessPool as exc:
            raise self.died() from exc
        except (OSError, RuntimeError) as exc:
            # A worker died while this submit was starting a replacement: the executor's thread closes its queues
            # as the pool breaks, and the start fails on them ("handle is closed"). That is the death, not a bug.
            if any(process.exitcode is not None for process in self._processes.values()):
                raise self.died() from exc
            raise
        # the executor's process table (no public one), kept to say how a worker ended
        self._processes.update(getattr(self._executor, "_processes", None) or {})
        return Encoding(future, self)

    def died(self) -> EncoderDied:
        codes, deadline = [], time.monotonic() + 2
        for process in self._processes.values():
            # the executor's thread may be reaping the same process: its exit code shows up a moment later
            while process.exitcode is None and time.monotonic() < deadline:
                process.join(timeout=0.05)
            codes.append(process.exitcode)
        return EncoderDied([c for c in codes if c is not None])

    def close(self) -> None:
        """Drops the batches not yet started, waits for the processes to exit."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._remove_file()

    def terminate(self) -> None:
        """Stops the processes now; batches not yet encoded are dropped."""
        # No public way to stop busy workers before Python 3.14's terminate_workers(): the executor's process table.
        # Workers go first: an executor shut down while its workers are stopped can wait for good, its feeder thread
        # blocked writing queued batches into a pipe nobody reads; with them gone it takes its broken-pool exit.
        processes = list((getattr(self._executor, "_processes", None) or {}).values())
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(timeout=5)
        # A worker stopped while it wrote a result leaves half a message in the result pipe, and the executor's thread
        # would wait for the rest for good (seen on a loaded machine: a streamed run hung after its hold-out): this
        # process holds the pipe's write end too, so no end of file ever comes. Closing that end turns the half
        # message into one, which the thread takes as a broken pool, and exits (tests/test_hf_private_apis.py pins
        # the name).
        writer = getattr(getattr(self._executor, "_result_queue", None), "_writer", None)
        if writer is not None and processes:
            writer.close()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._remove_file()

    def _remove_file(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self._tokenizer_file)
