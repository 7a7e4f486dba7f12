"""Opening a mix entry: local JSONL streamed through `datasets`, text-column detection, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparknet.config import SourceSpec
from sparknet.data.sources import iter_texts, open_source
from sparknet.errors import UserError
from tests.conftest import write_jsonl


def _rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_streams_texts_in_order_skipping_empty(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", ["one", "", "two", "three"])
    spec = SourceSpec(name="json", prob=1, data_files=str(path), label="a")
    assert list(iter_texts(spec)) == ["one", "two", "three"]
    assert type(open_source(spec)).__name__ == "IterableDataset"  # streamed, never materialised


def test_detects_a_common_text_column(tmp_path: Path) -> None:
    path = _rows(tmp_path / "b.jsonl", [{"id": 1, "content": "x y"}, {"id": 2, "content": "z"}])
    assert list(iter_texts(SourceSpec(name="json", prob=1, data_files=path, label="b"))) == ["x y", "z"]


def test_no_usable_text_column_lists_columns_and_names_text_field(tmp_path: Path) -> None:
    path = _rows(tmp_path / "c.jsonl", [{"id": 1, "title": "t", "body_html": "<p>"}])
    with pytest.raises(UserError) as err:
        list(iter_texts(SourceSpec(name="json", prob=1, data_files=path, label="c")))
    message = str(err.value)
    assert "columns found: id (int), title (str), body_html (str)" in message and '"text_field"' in message


def test_explicit_text_field_missing(tmp_path: Path) -> None:
    path = _rows(tmp_path / "d.jsonl", [{"text": "t"}])
    with pytest.raises(UserError, match="text_field 'body' is not a column; columns found: text"):
        list(iter_texts(SourceSpec(name="json", prob=1, data_files=path, text_field="body", label="d")))


def test_unreachable_hub_source_is_a_user_error() -> None:
    with pytest.raises(UserError, match="cannot open source 'x' .*HF_HUB_OFFLINE"):
        open_source(SourceSpec(name="sparknet-tests/no-such-dataset", prob=1, label="x"))


def test_text_column_comes_from_the_declared_columns_not_the_first_row(tmp_path: Path) -> None:
    """A first row with "text": null must not make the whole source read from `url`."""
    path = _rows(tmp_path / "n.jsonl", [{"url": "http://a", "text": None}, {"url": "http://b", "text": "body b"},
                                        {"url": "http://c", "text": "body c"}])
    assert list(iter_texts(SourceSpec(name="json", prob=1, data_files=path, label="n"))) == ["body b", "body c"]


def test_a_malformed_line_is_one_line_naming_source_file_row_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\n{"text": broken\n{"text": "c"}\n')
    with pytest.raises(UserError) as err:
        list(iter_texts(SourceSpec(name="json", prob=1, data_files=str(path), label="bad")))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"cannot read source 'bad' ({path}): "), message
    assert "row 2" in message and message.endswith("fix or remove the file")
