"""What a mix entry holds, known before it is read, and cheaply: the bytes of its local files (their sizes on disk)
and its rows (as its kind counts them, sparknet.config.kinds.LOCAL_KINDS: JSONL's lines, CSV's records, Parquet's
metadata, one per plain-text file). A Hub source's size is not known without reading it: None. Both follow from the
files alone (whose sha256 is part of every run's and dataset's inputs), so what is derived from them is the same on
every attempt at the same files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparknet.config.mix import SourceSpec, local_files


@dataclass(frozen=True)
class SourceSize:
    """A source's size on disk: None where it cannot be known cheaply (a Hub source; rows of a JSON array file).
    `rows` stops counting past `row_limit` (then it is that limit: "at least")."""

    bytes: int | None
    rows: int | None


def source_size(spec: SourceSpec, row_limit: int | None = None) -> SourceSize:
    """The bytes and rows of a local entry (rows counted up to `row_limit`); both None for a Hub source."""
    if spec.local is None:
        return SourceSize(None, None)
    files = [Path(real) for _named, real in local_files(vars(spec))]
    if not files:
        return SourceSize(None, None)
    total_bytes = sum(path.stat().st_size for path in files)  # compressed files: a lower bound of the text
    rows: int | None = 0
    for path in files:
        left = None if row_limit is None else row_limit - rows
        counted = spec.local.count_rows(path, left)
        if counted is None:
            rows = None
            break
        rows += counted
        if row_limit is not None and rows >= row_limit:
            rows = row_limit
            break
    return SourceSize(total_bytes, rows)

