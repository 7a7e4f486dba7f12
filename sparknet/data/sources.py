"""One mix entry opened as a lazy stream of document texts: a Hub dataset id, or `json` with local data files.

Always `streaming=True`: a source is read row by row and never materialised, whatever its size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sparknet.config import SourceSpec
from sparknet.errors import UserError

# Tried in order when a source names no text_field.
TEXT_FIELD_CANDIDATES = ("text", "content", "document", "body", "raw_content")


def open_source(spec: SourceSpec) -> Any:
    """The source as a streaming `datasets.IterableDataset` (rows as dicts)."""
    from datasets import load_dataset

    files = spec.resolved_data_files()
    if isinstance(files, list):
        files = {spec.split: files}  # a plain list of files is the split the entry names
    try:
        return load_dataset(spec.name, spec.subset, split=spec.split, data_files=files, streaming=True)
    except Exception as exc:  # noqa: BLE001 - any failure to open is reported against the user's mix entry
        hint = ""
        if spec.name != "json":
            hint = (
                " (Hub sources need network access or a local cache: with HF_HUB_OFFLINE=1 only cached datasets "
                "open; gated datasets need `hf auth login`)"
            )
        raise UserError(
            f"cannot open source {spec.label!r} ({spec.name}, split {spec.split!r}): {type(exc).__name__}: {exc}{hint}"
        ) from None


def declared_columns(rows: Any) -> dict[str, str] | None:
    """The stream's declared columns and their types (`string`, `int64`, ...) from its features, or None when the
    stream declares none (then the first row's column names stand in)."""
    features = getattr(rows, "features", None)
    if not features:
        return None
    return {name: str(getattr(feature, "dtype", type(feature).__name__)) for name, feature in features.items()}


# Arrow type names shown as the Python types users see in their JSON.
_SHOWN_TYPES = {"string": "str", "large_string": "str", "int64": "int", "int32": "int", "float64": "float",
                "double": "float", "bool": "bool", "null": "null"}


def pick_text_field(row: dict[str, Any], spec: SourceSpec, columns: dict[str, str] | None = None) -> str:
    """The column holding the document text: the entry's text_field, else the first common name among the declared
    `columns` (from the stream's features), else the only string column. Decided from the columns, not from one
    row's values, so a first row whose text is null does not send the whole source to another column."""
    if columns is None:  # no declared features: the row's keys are the columns, its values hint at their types
        columns = {k: "string" if isinstance(v, str) else ("null" if v is None else type(v).__name__)
                   for k, v in row.items()}
    shown = ", ".join(f"{k} ({_SHOWN_TYPES.get(t, t)})" for k, t in columns.items()) or "none"
    if spec.text_field is not None:
        if spec.text_field not in columns:
            raise UserError(
                f"source {spec.label!r}: text_field {spec.text_field!r} is not a column; columns found: {shown}"
            )
        return spec.text_field
    textual = {"string", "large_string", "null"}
    for name in TEXT_FIELD_CANDIDATES:
        if columns.get(name) in textual:
            return name
    strings = [k for k, t in columns.items() if t in ("string", "large_string")]
    if len(strings) == 1:
        return strings[0]
    raise UserError(
        f"source {spec.label!r}: no usable text column (looked for {', '.join(TEXT_FIELD_CANDIDATES)}); "
        f'columns found: {shown}. Set "text_field" in its mix entry to the column holding the text'
    )


def document_text(row: dict[str, Any], field: str, spec: SourceSpec) -> str | None:
    """The row's text in column `field` (None when the row has none); a non-text value is the user's mistake."""
    text = row.get(field)
    if text is not None and not isinstance(text, str):
        raise UserError(
            f"source {spec.label!r}: column {field!r} holds {type(text).__name__}, not text; "
            'set "text_field" to a text column'
        )
    return text


def read_rows(rows: Any, spec: SourceSpec) -> Iterator[dict[str, Any]]:
    """The rows of an opened source; a failure while reading (a malformed JSON line, a vanished file, a network
    error after the retries of `datasets`) becomes one UserError naming the source and the file."""
    it = iter(rows)
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except UserError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the reader raises, the user needs the source and file
            raise unreadable(spec, rows, exc) from None
        yield row


def unreadable(spec: SourceSpec, rows: Any, exc: BaseException) -> UserError:
    """The error for a source that opened but could not be read, on one line: the source, the file being read when
    it is known, the reader's own words (pyarrow's name the row within the block it parsed), and what to do."""
    where = _file_being_read(rows) or ", ".join(_data_file_names(spec)) or spec.name
    message = " ".join(str(exc).split()) or type(exc).__name__
    if spec.name == "json":
        fix = "fix or remove the file"
    else:  # a network failure after the retries of `datasets`: often passing
        fix = "check the network and run the same command again (an unfinished build restarts from the beginning)"
    return UserError(f"cannot read source {spec.label!r} ({where}): {type(exc).__name__}: {message}; {fix}")


def _file_being_read(rows: Any) -> str | None:
    """The file of the shard being read, from the stream's position; best effort, as it reads `datasets` internals."""
    try:
        state = rows.state_dict()
        while "shard_idx" not in state:
            state = state["examples_iterable"]
        ex_iterable = rows._ex_iterable
        while not hasattr(ex_iterable, "kwargs"):
            ex_iterable = ex_iterable.ex_iterable
        files = ex_iterable.kwargs.get("original_files") or ex_iterable.kwargs.get("files")
        return str(files[state["shard_idx"]])
    except Exception:  # noqa: BLE001 - no position known: the caller names the source's files instead
        return None


def _data_file_names(spec: SourceSpec) -> list[str]:
    files = spec.resolved_data_files() or []
    return [f for group in (files.values() if isinstance(files, dict) else [files]) for f in group]


def iter_texts(spec: SourceSpec, shuffle_buffer: int = 0, seed: int = 0) -> Iterator[str]:
    """Yields the non-empty document texts of a source: in the source's order, or shuffled through a buffer of
    `shuffle_buffer` documents (and shard order) with `seed`, deterministically."""
    rows = open_source(spec)
    if shuffle_buffer > 0:
        rows = rows.shuffle(seed=seed, buffer_size=shuffle_buffer)
    field = None
    for row in read_rows(rows, spec):
        if field is None:
            field = pick_text_field(row, spec, declared_columns(rows))
        text = document_text(row, field, spec)
        if text:
            yield text
