"""Names that are a local folder or a Hub id (TOKENIZER_DIR, MODELS): one rule tells which, so that a mistyped local
path is answered at once, naming what is there, and never spends a minute in Hub retries first.

A name that is a folder (relative names in the project root, as every script constant) is that folder. Otherwise
it is still a local path when it reads as one: it starts with `.`, `/` or `~`, it has more than one `/`, it is
blank, or its first part is a folder in the project or the current folder (`tokenizers/mine` where tokenizers/
exists: a missing folder, not the Hub user "tokenizers"). Every other name (`gpt2`, `owner/name`) is a Hub id.
"""

from __future__ import annotations

import os
from pathlib import Path

from sparknet.common.runtime import project_path

LISTED = 10  # folders named in a "holds:" list, at most


def local_path(name: str) -> Path | None:
    """The local path `name` stands for under the rule above, whether it exists or not; None for a Hub id."""
    folder = project_path(name)
    if folder.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1 or not name.strip():
        return folder
    if "/" in name:
        first = name.split("/")[0]
        for base in (project_path("."), Path(os.getcwd())):
            if (base / first).is_dir():
                return base / name
    return None


def not_found(what: str, name: str, folder: Path) -> str:
    """The start of the one-line answer for a local path that is not there: "tokenizer folder tokenizers/mine not
    found (looked for /abs/tokenizers/mine; tokenizers/ holds: a, b)", where the nearest folder above it is one the
    user made (the project root or the current folder would list unrelated things)."""
    return f"{what} {name} not found (looked for {folder}{_holds(folder)})"


def _holds(folder: Path) -> str:
    """"; tokenizers/ holds: a, b" for the nearest existing folder above `folder`, unless that is the project root,
    the current folder or the file system's root; else ""."""
    above = next((parent.resolve() for parent in folder.parents if parent.is_dir()), None)
    roots = [project_path(".").resolve(), Path(os.getcwd()).resolve()]
    if above is None or above in roots or above == Path(above.anchor):
        return ""
    children = sorted(child.name for child in above.iterdir()
                      if child.is_dir() and not child.name.startswith((".", "__")))  # not .git, __pycache__
    shown = ", ".join(children[:LISTED]) + (f", ... ({len(children)} in all)" if len(children) > LISTED else "")
    under = next((root for root in roots if above.is_relative_to(root)), None)
    label = above.relative_to(under) if under is not None else above
    return f"; {label}/ holds: {shown or 'no folders'}"
