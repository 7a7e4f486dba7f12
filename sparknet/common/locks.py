"""One writer per target: a tokenizer training or a dataset build into an OUTPUT_DIR, a training run of a RUN_NAME,
an export into an OUTPUT_DIR.

The lock is `filelock`'s (an OS file lock, the one huggingface_hub uses for its cache), held for the whole job:
the operating system releases it when the process ends, however it ends, so a lock left by a killed process is
simply taken by the next command. Beside the lock file the holder writes its pid and command, so that a refused
second command can name the process it is waiting for. Both files are removed when the job ends (`held`), so no
`.NAME.lock` stays beside an output; filelock takes a lock on a file removed meanwhile for none and tries again.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from sparknet.common.errors import UserError
from sparknet.common.runtime import temporary_path, write_json_atomic


def _holder(info: Path) -> str:
    try:
        data = json.loads(info.read_text(encoding="utf-8"))
        return f"process {data['pid']} ({data['command']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def lock_files(target: Path) -> tuple[Path, Path, Path]:
    """The files the lock of `target` puts beside it: the lock, its holder's record, and the record's temporary
    file while it is written (the longest name: sparknet.common.outputs checks that the file system takes it)."""
    info = target.with_name(f".{target.name}.lock.json")
    return target.with_name(f".{target.name}.lock"), info, temporary_path(info)


@contextmanager
def held(lock_file: Path, timeout: float = -1) -> Iterator[None]:
    """Holds filelock's lock on `lock_file` (waiting up to `timeout` seconds, -1: as long as it takes; filelock's
    Timeout when it cannot) and removes the file before letting it go: the lock of a job that ended leaves nothing
    behind. Safe against a process that opened the file meanwhile: filelock refuses a lock on an unlinked file
    (its link count is 0) and opens the path again."""
    from filelock import FileLock

    lock = FileLock(str(lock_file), timeout=timeout)
    lock.acquire()
    try:
        yield
    finally:
        try:
            lock_file.unlink(missing_ok=True)
        finally:
            lock.release()


@contextmanager
def exclusive(target: Path, what: str) -> Iterator[None]:
    """Holds the lock of `target` (a folder, locked through `.<name>.lock` beside it) or raises UserError at once
    naming the process that holds it. `what` names the job in that message ("a build", "a training run")."""
    from filelock import Timeout

    target.parent.mkdir(parents=True, exist_ok=True)
    lock_file, info, _ = lock_files(target)
    with ExitStack() as stack:  # its end removes the lock file and releases the lock (`held`)
        try:
            stack.enter_context(held(lock_file, timeout=0))
        except Timeout:
            raise UserError(f"{target} is in use: {what} into it is running as {_holder(info)}. Wait for it to end, "
                            "or stop it; two at once would write the same files") from None
        try:
            write_json_atomic(info, {"pid": os.getpid(), "command": " ".join(sys.argv)[:200]})  # seen whole
            yield
        finally:
            info.unlink(missing_ok=True)
