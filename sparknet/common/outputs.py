"""Where a script writes, checked before any work: each output folder is a folder or can be created as one (it is
no file, and no folder above it is a file), it can be written, and its name, and the names its one-writer lock puts
beside it, are names the file system takes. Every script calls `check_outputs` with all of its output locations
right after its constants are parsed, so that a bad one is one line naming the constant at once, not a traceback
after the work (a tokenizer trained for an hour, then PermissionError).

Writability is tried (a temporary file created and removed), not read from permission bits: root ignores those,
while a read-only mount or an immutable folder refuses root too. Nothing is created: a folder that does not exist
yet is checked through the nearest folder above it that does.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sparknet.common.errors import UserError

DEFAULT_NAME_MAX = 255  # bytes in a file name, where the file system does not say (ext4, xfs, btrfs, tmpfs: 255)


@dataclass(frozen=True)
class Output:
    """An output folder `path` and the constant that sets it (`constant`, e.g. OUTPUT_DIR). `name_constant` names
    the constant that sets the folder's own name when another one does (RUN_NAME under CHECKPOINTS_DIR); `locked`:
    the folder has a one-writer lock (sparknet.common.locks), whose files lie beside it, in the folder above."""

    constant: str
    path: Path
    name_constant: str | None = None
    locked: bool = False


def check_outputs(*outputs: Output) -> None:
    """Raises one UserError listing every output location that cannot be written (each named with its constant, its
    path, what is wrong and the fix), before any work. The locations are also where a full disk is looked for first
    (runtime.writes_to)."""
    from sparknet.common.runtime import writes_to

    found = [problem for output in outputs if (problem := _problem(output)) is not None]
    if found:
        raise UserError("; ".join(found))
    writes_to(*(output.path.parent if output.locked else output.path for output in outputs))


def _problem(output: Output) -> str | None:
    path = output.path
    existing, missing = path, []  # the nearest folder (or file) that exists, and the names below it to create
    # os.path's tests: a name too long or a path through a file is "not there", where Path's raise
    while not os.path.exists(existing) and existing != existing.parent:
        missing.append(existing.name)
        existing = existing.parent

    def blame(where: Path) -> str:
        """The constant to change: the name's own when the folder itself is at fault, else the folder's."""
        return output.name_constant if where == path and output.name_constant else output.constant

    if not os.path.isdir(existing):
        constant = blame(existing)
        return (f"{constant}={_shown(output, constant)}: {existing} is a file, not a folder: choose another "
                f"{constant}, or move the file away")
    name_max = _name_max(existing)
    for name in missing:
        if len(os.fsencode(name)) > name_max:
            constant = blame(path if name == path.name else existing)
            return (f"{constant}={_shown(output, constant)}: a name of {len(os.fsencode(name))} bytes, and the file "
                    f"system takes names of at most {name_max} bytes: choose a shorter {constant}")
    if output.locked:
        from sparknet.common.locks import lock_files

        own = len(os.fsencode(path.name))
        added = max(len(os.fsencode(lock.name)) for lock in lock_files(path)) - own
        if own + added > name_max:
            constant = blame(path)
            folder = "" if constant == output.name_constant else "its folder's name "
            return (f"{constant}={_shown(output, constant)}: its lock file beside it needs {added} bytes more than "
                    f"the name's {own}, and the file system takes names of at most {name_max} bytes: choose a "
                    f"shorter {constant} ({folder}at most {name_max - added} bytes)")
    # where the script creates something: the folder (or the one above it, which will hold it); a locked folder's
    # lock files go in the folder above it
    places = [existing] + ([path.parent] if output.locked and existing == path else [])
    for place in places:
        reason = _unwritable(place)
        if reason is not None:
            constant = blame(place)
            return (f"{constant}={_shown(output, constant)}: cannot write in {place} ({reason}): choose another "
                    f"{constant}, or make {place} writable")
    return None


def _shown(output: Output, constant: str) -> str:
    """The value shown after CONSTANT=: the folder's own name for its name's constant, with the whole path."""
    if constant == output.name_constant:
        return f"{output.path.name} ({output.path})"
    return str(output.path)


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):  # pragma: no cover - a file system or platform that does not say
        return DEFAULT_NAME_MAX


def _unwritable(folder: Path) -> str | None:
    """Why a file cannot be created in `folder` (the system's words), or None when one can."""
    try:
        fd, name = tempfile.mkstemp(prefix=".sparknet-write-test-", dir=folder)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(name)
    return None
