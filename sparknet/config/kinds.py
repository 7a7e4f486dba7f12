"""The local source kinds (a mix entry's `"name": "json" | "parquet" | "csv" | "text"` with `data_files`) and
everything that differs between them: what their files are called, their suffixes, how a file's rows and columns
are read cheaply before the build reads it, and what names the row a failed reader stopped at.

Here, beside the mix schema, rather than in data/source/ (which reads them): validating a mix before any work
(a file of another kind, a text_field that is no column, a label) needs the kinds, and config/ sits below data/.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LocalKind:
    """A kind of local data file a mix entry may name (`"name": "<kind>"` with `data_files`), and everything that
    differs between kinds: what its files are called in messages, the file suffixes that are this kind (for
    evaluation's DATA), how a file's rows are counted and its columns read before it is read, what datasets'
    packaged builder of the same name needs beyond the files, whether a file is one whole document, and what names
    the row a failed reader stopped at. A new kind must say how to read its columns: none falls into JSONL's."""

    files: str
    suffixes: tuple[str, ...]
    # a file's rows (the documents it holds), known cheaply: counted to a little past the limit given (None: all),
    # or None where they cannot be known without reading the file
    count_rows: Callable[[Path, int | None], int | None]
    # a file's columns, read cheaply (a header, a schema, the first rows); None where they are not known without
    # reading the whole file
    read_columns: Callable[[str], list[str] | None]
    builder_kwargs: tuple[tuple[str, Any], ...] = ()
    # a file is one document, its whole text: no field to choose, and two equal files are a repeated document
    whole_files: bool = False
    # (file, text field) -> what is wrong with its first bad row, by line, once the reader has failed on the file
    first_bad_row: Callable[[str, str], str | None] | None = None


def _open_bytes(path: Path) -> Any:
    import gzip

    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else path.open("rb")


def _jsonl_rows(path: Path, limit: int | None) -> int | None:
    """One row per non-blank line (a JSON string holds no raw newline); None for one JSON array (its rows are not
    its lines)."""
    with _open_bytes(path) as f:
        if f.read(4096).lstrip()[:1] == b"[":
            return None
        f.seek(0)
        rows = 0
        for line in f:
            rows += bool(line.strip())
            if limit is not None and rows > limit:
                break
    return rows


def _csv_rows(path: Path, limit: int | None) -> int:
    """The records after the header row, as a CSV reader parses them: a quoted field may hold newlines (a code
    file's lines are not rows). Blank lines are no records, as datasets' reader skips them."""
    import csv
    import io
    import sys

    previous = csv.field_size_limit(sys.maxsize)  # a document is one field, of any length
    try:
        with io.TextIOWrapper(_open_bytes(path), encoding="utf-8", errors="replace", newline="") as f:
            rows = -1  # the header row is no document
            for record in csv.reader(f):
                rows += bool(record)
                if limit is not None and rows > limit:
                    break
    finally:
        csv.field_size_limit(previous)
    return max(0, rows)


def _parquet_rows(path: Path, limit: int | None) -> int:
    """From the file's metadata: no reading of its (binary) data."""
    import pyarrow.parquet as pq

    return pq.read_metadata(path).num_rows


def _one_row(path: Path, limit: int | None) -> int:
    return 1


def _first_bad_json_line(path: str, text_field: str) -> str | None:
    """The first line of a JSON Lines file that is not a JSON object, said with its number from 1 and what a line
    must be, or None (all are, or the file is one JSON document rather than lines). Read only once the reader has
    failed: it names the line, where pyarrow names a row within the block it was parsing ("Trailing data at position
    5"). Blank and `null` lines are read as no row, as pyarrow reads them."""
    import gzip

    def bad(number: int, what: str) -> str:
        return (f"line {number} {what}: a JSONL file holds one JSON object per line, with its text in "
                f"{text_field!r} (the mix entry's \"text_field\", TEXT_FIELD in evaluation)")

    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as exc:
                    if number == 1 and not path.endswith((".jsonl", ".jsonl.gz")):
                        return None  # a .json file may be one (indented) document: not lines at all
                    return bad(number, f"is not valid JSON ({exc.msg}, column {exc.colno})")
                if value is not None and not isinstance(value, dict):
                    shown = json.dumps(value)
                    return bad(number, f"is {shown if len(shown) <= 40 else shown[:37] + '...'}, not a JSON object")
    except (OSError, UnicodeDecodeError, EOFError):
        return None  # the reader's own message says what is wrong with the file
    return None


# JSONL rows whose keys are read for a file's columns (a column no row among the first has is taken as missing)
COLUMN_ROWS = 1000


def _text_lines(path: str) -> Any:
    import gzip

    return (gzip.open if path.lower().endswith(".gz") else open)(path, "rt", encoding="utf-8", newline="")


def _jsonl_columns(path: str) -> list[str] | None:
    """The keys of the first COLUMN_ROWS rows; None for a file that is not lines of objects (one JSON document)."""
    columns: dict[str, None] = {}
    with _text_lines(path) as f:
        for number, line in enumerate(f):
            if number >= COLUMN_ROWS:
                break
            if line.strip():
                row = json.loads(line)
                if not isinstance(row, dict):
                    return None
                columns.update(dict.fromkeys(row))
    return list(columns)


def _csv_columns(path: str) -> list[str]:
    """The header row."""
    import csv

    with _text_lines(path) as f:
        return next(csv.reader(f), [])


def _parquet_columns(path: str) -> list[str]:
    """The schema's names: no reading of the data."""
    import pyarrow.parquet as pq

    return list(pq.read_schema(path).names)


def _text_columns(path: str) -> list[str]:
    return ["text"]  # datasets' text builder names its one column so


# The source kinds besides a Hub dataset: one place, that every question "is this source local files" asks
# (SourceSpec.local). Each is the datasets builder of that name, streamed. Adding a kind: an entry here and its
# end-to-end test (tests/test_source_kinds.py).
LOCAL_KINDS: dict[str, LocalKind] = {
    "json": LocalKind("JSONL", (".jsonl", ".json", ".jsonl.gz", ".json.gz"), _jsonl_rows, _jsonl_columns,
                      first_bad_row=_first_bad_json_line),
    "parquet": LocalKind("Parquet", (".parquet",), _parquet_rows, _parquet_columns),
    "csv": LocalKind("CSV (with a header row)", (".csv", ".csv.gz"), _csv_rows, _csv_columns),
    # a plain-text file is one document (datasets' default would make each line one)
    "text": LocalKind("plain-text (one document per file)", (".txt", ".md", ".txt.gz"), _one_row, _text_columns,
                      (("sample_by", "document"),), whole_files=True),
}


def local_kind_of_file(path: str) -> str | None:
    """The local kind whose suffix `path` ends with, or None."""
    name = path.lower()
    return next((kind for kind, spec in LOCAL_KINDS.items() if name.endswith(spec.suffixes)), None)


def local_file_columns(kind: str, path: str) -> list[str] | None:
    """The columns of one local data file of `kind`, read cheaply by the kind; None where they are not known without
    reading the whole file or the file cannot be read here (its reader says why)."""
    try:
        return LOCAL_KINDS[kind].read_columns(path)
    except (OSError, UnicodeDecodeError, ValueError, EOFError):
        return None  # json.JSONDecodeError and pyarrow's errors are ValueErrors: not lines of objects, or damaged
