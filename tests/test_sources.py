"""Opening a mix entry: local JSONL streamed through `datasets`, text-column detection, clear errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparknet.common.errors import UserError
from sparknet.config.mix import SourceSpec, parse_config
from sparknet.data.source.hub_retries import iter_texts
from sparknet.data.source.opening import open_source, resolve_revisions
from tests.helpers import write_jsonl


def _rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_streams_texts_in_order_skipping_empty(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", ["one", "", "two", "three"])
    spec = SourceSpec(name="json", prob=1, data_files=str(path), label="a")
    assert list(iter_texts(spec)) == ["one", "two", "three"]
    assert type(open_source(spec)).__name__ == "IterableDataset"  # streamed, never materialised


def test_rows_without_text_are_skipped_with_a_warning_naming_the_row(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    from sparknet.data.source.rank_reader import SourceReader

    path = _rows(tmp_path / "m.jsonl", [{"text": "one"}, {"content": "kept under another key"}, {"text": "two"},
                                        {"text": None}])
    spec = SourceSpec(name="json", prob=1, data_files=path, label="m")
    for read in (lambda: list(iter_texts(spec)), lambda: [t for t, _ in SourceReader(spec)]):
        caplog.clear()
        with caplog.at_level("WARNING"):
            assert read() == ["one", "two"]
        warnings = [r.getMessage() for r in caplog.records if "has no text" in r.getMessage()]
        assert len(warnings) == 1 and "row 1 has no text in column 'text'" in warnings[0]


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
    """The source has two files and the second is broken: the message names that file alone (read from the
    stream's position), not the source's files."""
    good = write_jsonl(tmp_path / "good.jsonl", ["x", "y"])
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\n{"text": broken\n{"text": "c"}\n')
    with pytest.raises(UserError) as err:
        list(iter_texts(SourceSpec(name="json", prob=1, data_files=[str(good), str(path)], label="bad")))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"cannot read source 'bad' ({path}): "), message
    assert "line 3" in message and message.endswith("fix or remove the line")


def test_a_local_folder_opens_by_name_and_refuses_a_revision(tmp_path: Path) -> None:
    """datasets reads a local folder named like a Hub repo but ignores `revision` there without a word (measured:
    any revision gives the folder's rows), so a pin on one is refused rather than recorded as if it held."""
    write_jsonl(tmp_path / "ds" / "train.jsonl", ["one", "two"])
    folder = str(tmp_path / "ds")
    assert list(iter_texts(SourceSpec(name=folder, prob=1, label="ds"))) == ["one", "two"]
    with pytest.raises(UserError) as err:
        open_source(SourceSpec(name=folder, prob=1, revision="no-such-revision", label="ds@no-such-revision"))
    message = str(err.value)
    assert "\n" not in message and message.startswith("source 'ds@no-such-revision': revision 'no-such-revision' ")
    assert message.endswith('remove "revision"')


def test_revisions_resolve_to_none_offline_and_for_local_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Offline (as the tests run) no Hub call is made: every source resolves to None, without waiting."""
    from huggingface_hub import HfApi

    calls = []
    monkeypatch.setattr(HfApi, "dataset_info", lambda self, *args, **kwargs: calls.append(args))
    path = write_jsonl(tmp_path / "a.jsonl", ["x"])
    config = parse_config({"seed": 1, "context_length": 8, "target_tokens": 8, "mix": [
        {"name": "json", "prob": 1, "data_files": str(path)},
        {"name": "sparknet-tests/no-such-dataset", "prob": 1, "revision": "v1"},
        {"name": "sparknet-tests/no-such-dataset", "prob": 1}]})
    with caplog.at_level("WARNING"):
        assert resolve_revisions(config) == {"a": None, "no-such-dataset@v1": None, "no-such-dataset": None}
    assert calls == [] and "cannot reach the Hub" not in caplog.text


def test_an_unreachable_hub_resolves_no_revision_quickly_and_says_so(tmp_path: Path) -> None:
    """Online but with no Hub to answer (a closed local port as the endpoint): one warning, None for every source,
    no wait per source. Run in a subprocess, as huggingface_hub reads its endpoint and offline flag at import."""
    import subprocess
    import sys

    code = (
        "import time\n"
        "from sparknet.config.mix import parse_config\n"
        "from sparknet.data.source.opening import resolve_revisions\n"
        "config = parse_config({'seed': 1, 'context_length': 8, 'target_tokens': 8, 'mix': [\n"
        "    {'name': 'sparknet-tests/a', 'prob': 1, 'revision': 'v1'}, {'name': 'sparknet-tests/b', 'prob': 1}]})\n"
        "t = time.time()\n"
        "print(resolve_revisions(config), round(time.time() - t, 1))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                                                             "TRANSFORMERS_OFFLINE")}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    revisions, seconds = proc.stdout.rsplit(" ", 1)
    assert revisions == "{'a@v1': None, 'b': None}" and float(seconds) < 5
    assert proc.stderr.count("cannot reach the Hub") == 1


def test_an_empty_data_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "zero.jsonl").write_text("")
    spec = SourceSpec(name="json", prob=1, data_files=str(tmp_path / "zero.jsonl"), label="zero")
    with pytest.raises(UserError, match=r"source 'zero': its data file .*zero\.jsonl is empty \(0 bytes\)"):
        list(iter_texts(spec))


@pytest.mark.parametrize("line", ["[1, 2]", '"text"', "5"])
def test_a_line_that_is_not_a_json_object_is_named_by_file_and_line(line: str, tmp_path: Path) -> None:
    """pyarrow says "Trailing data at position 5" or "changed from object to string in row 0": the file is scanned
    for the first line that is not a JSON object, and that line is named with what is expected."""
    good = write_jsonl(tmp_path / "good.jsonl", ["x", "y"], field="body")
    path = tmp_path / "bad.jsonl"
    path.write_text(f'{{"body": "a"}}\n\n{{"body": "b"}}\n{line}\n{{"body": "c"}}\n')
    with pytest.raises(UserError) as err:
        list(iter_texts(SourceSpec(name="json", prob=1, data_files=[str(good), str(path)], label="bad",
                                   text_field="body")))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"cannot read source 'bad' ({path}): line 4 is {line}, not a "
                                                      "JSON object"), message
    assert "one JSON object per line" in message and "'body'" in message and "Trailing data" not in message


def test_a_broken_line_is_named_by_its_line_number_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\n{"text": broken\n{"text": "c"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl\): line 3 is not valid JSON \(Expecting value"):
        list(iter_texts(SourceSpec(name="json", prob=1, data_files=str(path), label="bad")))


@pytest.mark.parametrize("kind", ["json", "text"])
def test_invalid_utf8_is_named_by_file_and_line(kind: str, tmp_path: Path) -> None:
    """The decoder says "byte 0xe9 in position 3" of the block it was decoding: the message names the file and
    the line (41 here) where the byte is, and what to do."""
    lines = [json.dumps({"text": f"document {i} in plain words"}).encode() if kind == "json" else
             f"document {i} in plain words".encode() for i in range(60)]
    lines[40] = b'{"text": "caf\xe9 au lait"}' if kind == "json" else b"caf\xe9 au lait"
    path = tmp_path / ("latin1.jsonl" if kind == "json" else "latin1.txt")
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(UserError) as err:
        list(iter_texts(SourceSpec(name=kind, prob=1, data_files=str(path), label="latin1")))
    message = str(err.value)
    column = 14 if kind == "json" else 4
    assert "\n" not in message and message.startswith(
        f"cannot read source 'latin1' ({path}): line 41 is not valid UTF-8 (byte 0xe9 at column {column}): "), message
    assert "save the file as UTF-8" in message and "position" not in message


@pytest.mark.parametrize("text_first", [True, False])
def test_a_source_mixing_text_rows_and_token_id_rows_is_refused_naming_the_first_of_each(
        text_first: bool, tmp_path: Path) -> None:
    """Half the rows text, half token ids: read as text, the id rows were skipped as rows without text (0 of 50
    kept, the only warning advising text_field). Refused in both orders, by the reader of the build and stream and
    by the tokenizer's, naming the first row of each kind."""
    from sparknet.data.source.rank_reader import SourceReader

    text_rows = [{"text": f"document {i}"} for i in range(50)]
    id_rows = [{"input_ids": [5, 6, 7 + i]} for i in range(50)]
    rows = [row for pair in zip(text_rows, id_rows, strict=True) for row in (pair if text_first else pair[::-1])]
    spec = SourceSpec(name="json", prob=1, data_files=_rows(tmp_path / "both.jsonl", rows), label="both")
    first_text, first_ids = (0, 1) if text_first else (1, 0)
    expected = (f"source 'both' mixes rows of text and rows of token ids ('input_ids'): row {first_text} is the "
                f"first with text, row {first_ids} the first with token ids")
    for read in (lambda: list(iter_texts(spec)), lambda: [t for t, _ in SourceReader(spec, vocab_size=100)]):
        with pytest.raises(UserError) as err:
            read()
        assert str(err.value).startswith(expected) and "split its rows into two sources" in str(err.value)
