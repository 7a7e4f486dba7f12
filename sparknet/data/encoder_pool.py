"""Encoder processes shared by the packed build and the stream: one single-threaded `DocumentEncoder` per process.

`concurrent.futures.ProcessPoolExecutor`, not `multiprocessing.Pool`: when a worker dies (the system's out-of-memory
killer, a `kill -9`), Pool starts a replacement and waits forever for the batch the dead one held, so a build or a
training run hangs with no message; the executor breaks instead, and `EncoderDied` says what happened and what to do.
Processes are spawned, not forked: a forked tokenizer with live threads can deadlock. Workers ignore Ctrl-C: it
reaches the whole process group, and the main process, which handles it (saving a checkpoint, the build's
position), still needs its encoders for that. Workers exit when the main process is gone (kill -9): unlike Pool's,
the executor's workers hold their task queue's writing end, never see it close and would wait forever, orphaned.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from sparknet.data.packing import DocumentEncoder
from sparknet.errors import UserError


class EncoderDied(UserError):
    """An encoder process was killed from outside the pipeline."""

    def __init__(self) -> None:
        super().__init__(
            "an encoder process died (killed from outside, most often by the system when memory runs out): free "
            "memory or lower NUM_WORKERS, then run the same command again: it goes on from its last saved position"
        )


_WORKER_ENCODER: DocumentEncoder | None = None


def _init_worker(tokenizer_json: str, eos_id: int, dtype: str) -> None:
    global _WORKER_ENCODER
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the pool gives the parallelism
    _WORKER_ENCODER = DocumentEncoder(tokenizer_json, eos_id, dtype)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:  # a dead parent's children are handed to another process
        time.sleep(0.5)
    os._exit(1)


def _encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    assert _WORKER_ENCODER is not None, "_init_worker did not run"
    return _WORKER_ENCODER(texts)


class Encoding:
    """One batch being encoded; `get()` waits for `(flat tokens, lengths)`."""

    def __init__(self, future: Future) -> None:
        self._future = future

    def get(self) -> tuple[np.ndarray, np.ndarray]:
        try:
            return self._future.result()
        except BrokenProcessPool as exc:
            raise EncoderDied() from exc


class EncoderPool:
    """`workers` encoder processes; `submit(texts)` starts encoding a batch."""

    def __init__(self, workers: int, tokenizer_json: str, eos_id: int, dtype: np.dtype) -> None:
        self._executor = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                                             initargs=(tokenizer_json, eos_id, np.dtype(dtype).name))

    def submit(self, texts: list[str]) -> Encoding:
        try:
            return Encoding(self._executor.submit(_encode, texts))
        except BrokenProcessPool as exc:
            raise EncoderDied() from exc

    def close(self) -> None:
        """Waits for the batches submitted, then for the processes to exit."""
        self._executor.shutdown(wait=True)

    def terminate(self) -> None:
        """Stops the processes now; batches not yet encoded are dropped."""
        # no public way to stop busy workers before Python 3.14's terminate_workers(): the executor's process table
        processes = list((getattr(self._executor, "_processes", None) or {}).values())
        self._executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(timeout=5)
