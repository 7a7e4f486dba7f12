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


def pick_text_field(row: dict[str, Any], spec: SourceSpec) -> str:
    """The column holding the document text: the entry's text_field, else the first usable common name."""
    columns = ", ".join(f"{k} ({type(v).__name__})" for k, v in row.items()) or "none"
    if spec.text_field is not None:
        if spec.text_field not in row:
            raise UserError(
                f"source {spec.label!r}: text_field {spec.text_field!r} is not a column; columns found: {columns}"
            )
        return spec.text_field
    for name in TEXT_FIELD_CANDIDATES:
        if isinstance(row.get(name), str):
            return name
    strings = [k for k, v in row.items() if isinstance(v, str)]
    if len(strings) == 1:
        return strings[0]
    raise UserError(
        f"source {spec.label!r}: no usable text column (looked for {', '.join(TEXT_FIELD_CANDIDATES)}); "
        f'columns found: {columns}. Set "text_field" in its mix entry to the column holding the text'
    )


def iter_texts(spec: SourceSpec, shuffle_buffer: int = 0, seed: int = 0) -> Iterator[str]:
    """Yields the non-empty document texts of a source: in the source's order, or shuffled through a buffer of
    `shuffle_buffer` documents (and shard order) with `seed`, deterministically."""
    rows = open_source(spec)
    if shuffle_buffer > 0:
        rows = rows.shuffle(seed=seed, buffer_size=shuffle_buffer)
    field = None
    for row in rows:
        if field is None:
            field = pick_text_field(row, spec)
        text = row.get(field)
        if text is None:
            continue
        if not isinstance(text, str):
            raise UserError(
                f"source {spec.label!r}: column {field!r} holds {type(text).__name__}, not text; "
                'set "text_field" to a text column'
            )
        if text:
            yield text
