"""A file operation that fails for a reason of the machine, not of SparkNet: no permission, a file size limit
(`ulimit -f`), a read-only disk, a file where a folder should be. Every script turns one into one line naming the
path and what the errno means (`sparknet.config.cli.run_script`), as it already does for a full disk
(`runtime.disk_full`); the code that writes keeps its work whole meanwhile (outputs put in place by renames, results
printed and saved elsewhere: sparknet.eval.reports).

Libraries that write through their own code lose the path and keep only the operating system's code (safetensors:
"I/O error: File too large (os error 27)"): `writing(path)` puts the path back, as the OSError it was.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sparknet.common.errors import exception_chain

# what to do, by errno, after "cannot write PATH: <the errno's meaning> (NAME)"
ADVICE = {
    errno.EFBIG: "the file size limit (`ulimit -f`) or the file system's largest file is reached: raise the limit, "
                 "or write elsewhere",
    errno.EACCES: "no permission to write there: make it writable for this user, or write elsewhere",
    errno.EPERM: "the operation is not permitted there: make it writable for this user, or write elsewhere",
    errno.EROFS: "the file system is read-only: remount it writable, or write elsewhere",
    errno.ENOTDIR: "a file is in the way where a folder should be: move it away",
    errno.EISDIR: "a folder is in the way where a file should be: move it away",
    errno.EDQUOT: "the disk quota is used up: free space, or write elsewhere",
    errno.EIO: "the disk reported an input/output error: check the disk, or write elsewhere",
    errno.ENAMETOOLONG: "the name is too long for the file system: choose a shorter one",
    errno.ENOENT: "a folder on the way is missing (deleted while the script ran?): create it, or write elsewhere",
    errno.EEXIST: "a file is in the way where a folder should be: move it away",
    errno.ENOSPC: "the disk is full: free space, or write elsewhere",
}


def fault_line(path: str, code: int) -> str:
    """"cannot write PATH: File too large (EFBIG): <advice>"."""
    name = errno.errorcode.get(code, f"errno {code}")
    advice = ADVICE.get(code, "fix it, or write elsewhere")
    return f"cannot write {path}: {os.strerror(code)} ({name}): {advice}"


def write_fault(exc: BaseException) -> str | None:
    """One line for a file operation that failed for a reason of the machine, when `exc` (or what caused it) is
    one: an OSError that names its file, or a library's error that carries the operating system's code (its path
    put back by `writing`). None for anything else, a full disk included (`runtime.disk_full` says that)."""
    for error in exception_chain(exc):
        if isinstance(error, OSError) and error.errno and error.errno != errno.ENOSPC and error.filename:
            return fault_line(str(error.filename), error.errno)
    return None


def library_os_code(exc: BaseException) -> int | None:
    """The operating system's error code a library's own error carries in its words (safetensors: "I/O error: File
    too large (os error 27)", or `Os { code: 27, ...}` in older releases), or None."""
    found = re.search(r"\(os error (\d+)\)|Os \{ code: (\d+)", str(exc))
    return int(found.group(1) or found.group(2)) if found else None


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Writes to `path` inside: a library's error that carries the operating system's code but not the path (a
    SafetensorError under `ulimit -f`) is raised again as the OSError it was, naming `path`."""
    try:
        yield
    except OSError:
        raise
    except Exception as exc:
        code = library_os_code(exc)
        if code is None:
            raise
        raise OSError(code, os.strerror(code), str(path)) from exc
