"""Local source kinds (sparknet.config.kinds.LOCAL_KINDS): the same documents as Parquet, CSV or plain-text files give
what they give as JSONL, the reference every other test checks against an independent computation: the same packed
dataset byte for byte, the same stream, the same tokenizer, the same evaluation; and the bad cases are one line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparknet.common.errors import UserError
from sparknet.config.mix import LOCAL_KINDS, load_config
from tests.helpers import read_texts, run_script, stream_of, write_config, write_jsonl

KINDS = ["parquet", "csv", "text"]


@pytest.fixture(scope="module")
def files(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Path]]:
    """The first 150 prose documents of the corpus, cut to 400 characters (about 100 tokens: a build of 12k tokens
    uses most of them), as each kind: {kind: (data_files, folder)}."""
    texts = [text[:400] for text in read_texts(corpus_dir / "prose.train.jsonl")[:150]]
    out = tmp_path_factory.mktemp("kinds")
    write_jsonl(out / "docs.jsonl", texts)
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), out / "docs.parquet")
    with (out / "docs.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        writer.writerows(enumerate(texts))
    (out / "docs").mkdir()
    for i, text in enumerate(texts):  # a plain-text file is one document
        (out / "docs" / f"{i:03d}.txt").write_text(text, encoding="utf-8")
    return {"json": (str(out / "docs.jsonl"), out), "parquet": (str(out / "docs.parquet"), out),
            "csv": (str(out / "docs.csv"), out), "text": (str(out / "docs" / "*.txt"), out)}


def _config(kind: str, files: dict[str, tuple[str, Path]], tmp_path: Path, **entry: object) -> Path:
    return write_config(tmp_path / f"{kind}.json", [{"name": kind, "prob": 1, "data_files": files[kind][0], **entry}],
                        context_length=128)


def test_every_local_kind_is_tested_here() -> None:
    assert set(LOCAL_KINDS) == {"json", *KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_a_build_from_each_kind_is_the_jsonl_build_byte_for_byte(kind: str, files: dict, tokenizer_dir: Path,
                                                                 tmp_path: Path) -> None:
    from sparknet.data.packed.build import BuildSpec, build_dataset

    built = {}
    for name in ("json", kind):
        out = tmp_path / name
        build_dataset(BuildSpec(config=load_config(_config(name, files, tmp_path)), tokenizer=str(tokenizer_dir),
                                output_dir=out, target_tokens=12_000, val_tokens=1_000, block_size=128, seed=0,
                                shuffle_buffer=20))
        built[name] = out
    for split in ("train.bin", "val.bin"):
        assert (built[kind] / split).read_bytes() == (built["json"] / split).read_bytes(), split
    manifest = json.loads((built[kind] / "manifest.json").read_text())
    assert list(manifest["splits"]["train"]["sources"]) == ["docs"]  # the file's stem (a glob: its folder)
    assert "first data file's stem" in manifest["label_rule"] and manifest["source_revisions"] == {}


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_from_each_kind_is_the_jsonl_stream(kind: str, files: dict, tokenizer_dir: Path,
                                                     tmp_path: Path) -> None:
    from sparknet.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir))
    blocks = {}
    for name in ("json", kind):
        stream = stream_of(load_config(_config(name, files, tmp_path)),
                           (tokenizer_dir / "tokenizer.json").read_text(), tok.eos_token_id, shuffle_buffer=20)
        blocks[name] = [item["input_ids"].tolist() for _, item in zip(range(40), stream, strict=False)]
        stream.close()
    assert len(blocks[kind]) == 40 and blocks[kind] == blocks["json"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_tokenizer_from_each_kind_is_the_jsonl_tokenizer(kind: str, files: dict, tmp_path: Path) -> None:
    from sparknet.bpe import train_tokenizer

    for name in ("json", kind):
        train_tokenizer(load_config(_config(name, files, tmp_path)), tmp_path / f"tok-{name}", vocab_size=400,
                        max_bytes=60_000, heldout_docs=5)
    assert ((tmp_path / f"tok-{kind}" / "tokenizer.json").read_text()
            == (tmp_path / "tok-json" / "tokenizer.json").read_text())


@pytest.mark.slow
def test_perplexity_of_each_kind_is_that_of_the_jsonl(files: dict, token_files: Path, random_model: Path,
                                                      tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from sparknet.eval.data import DataRequest, load_documents
    from sparknet.eval.perplexity import evaluate_perplexity

    reference = load_documents(files["json"][0])
    assert len(reference) == 150
    for kind in KINDS:
        assert load_documents(files[kind][0]) == reference, kind
    saved = {}
    # the script, as users run it, on Parquet; the JSONL and the pre-tokenized rows (decoded with the model's own
    # tokenizer) through the evaluation the script calls, in this process
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data",
                      files["parquet"][0], "--context", 16, "--max_documents", 20, "--eval_dir", tmp_path / "parquet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "is pre-tokenized" not in proc.stderr
    saved["parquet"] = next(iter(json.loads((tmp_path / "parquet" / "randrun" / "perplexity.json").read_text())
                                 .values()))
    for kind, data in (("json", files["json"][0]), ("ids", str(token_files))):
        caplog.clear()
        with caplog.at_level("WARNING", logger="sparknet"):
            (saved[kind],) = evaluate_perplexity([str(random_model)], DataRequest(data, max_documents=20), context=16,
                                                 eval_root=str(tmp_path / kind))
        assert ("is pre-tokenized and records no tokenizer: its ids are decoded with" in caplog.text) == (kind == "ids")
    for kind in ("parquet", "ids"):
        assert saved[kind]["tokens"] == saved["json"]["tokens"] > 0 and saved[kind]["bytes"] == saved["json"]["bytes"]
        assert saved[kind]["nll"] == saved["json"]["nll"], kind


@pytest.mark.parametrize("kind", ["json", *KINDS])
def test_a_sources_rows_are_known_before_reading_it_and_are_its_documents(kind: str, files: dict,
                                                                          tmp_path: Path) -> None:
    """The rows a source's size gives (what scales the stream's SHUFFLE_BUFFER) are the documents its reader yields,
    for every kind: a document's newlines (inside a CSV's quoted field, in a Parquet file's bytes) are no rows."""
    from sparknet.data.scaled_defaults import source_size
    from sparknet.data.source.hub_retries import iter_texts

    spec = load_config(_config(kind, files, tmp_path)).mix[0]
    documents = list(iter_texts(spec))
    assert len(documents) == 150 and sum(text.count("\n") for text in documents) > 150  # many lines per document
    assert source_size(spec).rows == 150 and source_size(spec, row_limit=40).rows == 40


def test_a_local_kind_needs_its_files_and_takes_no_subset_or_revision(tmp_path: Path) -> None:
    for kind, files in (("parquet", "Parquet"), ("csv", "CSV"), ("text", "plain-text")):
        with pytest.raises(UserError, match=f'mix\\[0\\].data_files: a "{kind}" source needs "data_files": the local '
                                            f"{files}"):
            load_config(write_config(tmp_path / "c.json", [{"name": kind, "prob": 1}]))
        with pytest.raises(UserError, match=f'a "{kind}" source has no subsets'):
            load_config(write_config(tmp_path / "c.json", [{"name": kind, "prob": 1, "data_files": "x",
                                                             "subset": "a"}]))


def test_a_missing_text_column_is_refused_when_the_config_is_read(files: dict, tokenizer_dir: Path,
                                                                  tmp_path: Path) -> None:
    """A text_field that no file has is a config mistake, found as a key's typo is (before any data is opened),
    naming the file, its columns and the nearest one; for every kind whose columns are cheap to read."""
    import time

    from sparknet.config.mix import ConfigError

    for kind, field, columns in (("csv", "texts", "id, text"), ("parquet", "txt", "id, text"),
                                 ("json", "Text", "text")):
        started = time.perf_counter()
        with pytest.raises(ConfigError) as caught:
            load_config(_config(kind, files, tmp_path, text_field=field))
        assert time.perf_counter() - started < 1.0
        assert (f"mix[0].text_field: {field!r} is not a column of {files[kind][0]} (columns: {columns}): did you "
                "mean 'text'?") in str(caught.value), caught.value
    load_config(_config("csv", files, tmp_path, text_field="text"))  # a column that is there
    cfg = _config("csv", files, tmp_path, text_field="body")
    proc = run_script("build_dataset_v5.py", "--config", cfg, "--tokenizer_dir", tokenizer_dir, "--output_dir",
                      tmp_path / "out", "--target_tokens", 5000, "--val_tokens", 500, "--block_size", 128,
                      "--shuffle_buffer", 0, "--num_workers", 0)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert "mix[0].text_field: 'body' is not a column of" in line and "(columns: id, text): name the column" in line
    assert not (tmp_path / "out").exists()


def test_a_file_of_another_kind_in_a_glob_is_refused_naming_it(files: dict, tmp_path: Path) -> None:
    """A CSV matched by a text entry's glob would be read as one plain document: refused, naming the file and its
    kind. A suffix no kind claims (.py) is read as the entry's kind."""
    import shutil

    from sparknet.config.mix import ConfigError

    mixed = tmp_path / "mixed"
    shutil.copytree(files["text"][1] / "docs", mixed)
    (mixed / "notes.py").write_text("print('a plain-text document')\n")
    entry = {"name": "text", "prob": 1, "data_files": str(mixed / "*")}
    assert load_config(write_config(tmp_path / "ok.json", [entry])).mix[0].label == "mixed"
    shutil.copy(files["csv"][0], mixed / "table.csv")
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path / "mixed.json", [entry]))
    message = str(caught.value)
    assert f"mix[0].data_files: {str(mixed / '*')!r} names {mixed / 'table.csv'}, a CSV (with a header row) file, in " \
           'a "text" entry that would read it as plain-text (one document per file)' in message, message
    assert '(e.g. *.txt), and give the csv files an entry of their own ("name": "csv")' in message
    with pytest.raises(ConfigError, match=r"names .*docs\.jsonl, a JSONL file, in a \"csv\" entry"):
        load_config(write_config(tmp_path / "c.json", [{"name": "csv", "prob": 1, "data_files": files["json"][0]}]))


@pytest.fixture(scope="module")
def token_files(files: dict, tokenizer_dir: Path) -> Path:
    """The same documents pre-tokenized with the test tokenizer, as Parquet rows {id, input_ids} (every third one
    already ending with eos, as some pre-tokenized datasets store them): folder ids/docs.parquet, so that its label
    is the JSONL's."""
    from sparknet.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir))
    texts = read_texts(Path(files["json"][0]))
    ids = [tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if i % 3 == 0 else [])
           for i, text in enumerate(texts)]
    folder = files["json"][1] / "ids"
    folder.mkdir(exist_ok=True)
    pq.write_table(pa.table({"id": [f"doc{i}" for i in range(len(ids))], "input_ids": ids}), folder / "docs.parquet")
    return folder / "docs.parquet"


def test_a_pre_tokenized_source_is_mixed_as_its_text_would_be(files: dict, token_files: Path, corpus_dir: Path,
                                                              tokenizer_dir: Path, tmp_path: Path) -> None:
    """Recognised by its input_ids column alone, its documents end with one eos, and mixed by tokens with a text
    source it gives the build of its texts byte for byte (its "tokenizer", the run's, is accepted)."""
    from sparknet.data.packed.build import BuildSpec, build_dataset

    code = {"name": "json", "prob": 0.4, "data_files": str(corpus_dir / "code.train.jsonl")}
    mixes = {"text": [{"name": "json", "prob": 0.6, "data_files": files["json"][0]}, code],
             "ids": [{"name": "parquet", "prob": 0.6, "data_files": str(token_files),
                      "tokenizer": str(tokenizer_dir)}, code]}
    for name, mix in mixes.items():
        build_dataset(BuildSpec(config=load_config(write_config(tmp_path / f"{name}.json", mix, context_length=128)),
                                tokenizer=str(tokenizer_dir), output_dir=tmp_path / name, target_tokens=20_000,
                                val_tokens=2_000, block_size=128, seed=0, shuffle_buffer=20,
                                num_workers=2 if name == "ids" else 0))
    for split in ("train.bin", "val.bin"):
        assert (tmp_path / "ids" / split).read_bytes() == (tmp_path / "text" / split).read_bytes(), split
    reports = {name: json.loads((tmp_path / name / "manifest.json").read_text())["splits"]["train"]["sources"]
               for name in mixes}
    assert set(reports["ids"]) == {"docs", "code"} and reports["ids"] == reports["text"]


def test_a_pre_tokenized_stream_is_the_stream_of_its_text(files: dict, token_files: Path, tokenizer_dir: Path,
                                                          tmp_path: Path) -> None:
    from sparknet.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir))
    blocks = {}
    for name, entry in (("text", {"name": "json", "data_files": files["json"][0]}),
                        ("ids", {"name": "parquet", "data_files": str(token_files)})):
        config = load_config(write_config(tmp_path / f"{name}.json", [{**entry, "prob": 1}], context_length=128))
        stream = stream_of(config, (tokenizer_dir / "tokenizer.json").read_text(), tok.eos_token_id,
                           shuffle_buffer=20)
        blocks[name] = [item["input_ids"].tolist() for _, item in zip(range(40), stream, strict=False)]
        stream.close()
    assert len(blocks["ids"]) == 40 and blocks["ids"] == blocks["text"]


@pytest.mark.slow
def test_ids_beyond_the_vocabulary_another_tokenizer_or_a_tokenizer_training_are_one_line(
        files: dict, token_files: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    from sparknet.bpe import train_tokenizer
    from sparknet.data.packed.build import BuildSpec, build_dataset

    rows = [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 5000]}]
    (tmp_path / "big.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = write_config(tmp_path / "big.json", [{"name": "json", "prob": 1, "data_files": str(tmp_path / "big.jsonl")}])
    proc = run_script("build_dataset_v5.py", "--config", cfg, "--tokenizer_dir", tokenizer_dir, "--output_dir",
                      tmp_path / "out", "--target_tokens", 5000, "--val_tokens", 500, "--block_size", 128,
                      "--shuffle_buffer", 0, "--num_workers", 0)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert ("source 'big': row 1 holds token id 5000, outside the tokenizer's 1024 ids (0 to 1023)"
            in proc.stderr.strip().splitlines()[-1])
    other = tmp_path / "other-tok"
    train_tokenizer(load_config(_config("json", files, tmp_path)), other, vocab_size=300, max_bytes=20_000,
                    heldout_docs=2)
    mix = [{"name": "parquet", "prob": 1, "data_files": str(token_files), "tokenizer": str(other)}]
    with pytest.raises(UserError, match=f"source 'docs' was tokenized with {other} .*not with this run's tokenizer"):
        build_dataset(BuildSpec(config=load_config(write_config(tmp_path / "o.json", mix)), tokenizer=str(
            tokenizer_dir), output_dir=tmp_path / "o", target_tokens=5000, val_tokens=500, block_size=128, seed=0))
    assert not (tmp_path / "o").exists()
    mix = [{"name": "parquet", "prob": 1, "data_files": str(token_files)}]
    with pytest.raises(UserError, match="source 'docs' holds token ids \\('input_ids'\\), not text: a tokenizer"):
        train_tokenizer(load_config(write_config(tmp_path / "t.json", mix)), tmp_path / "tok", vocab_size=300,
                        max_bytes=20_000, heldout_docs=2)


def test_a_rows_token_ids_are_checked_one_by_one() -> None:
    from sparknet.config.mix import SourceSpec
    from sparknet.data.source.opening import RowDocuments

    docs = RowDocuments(SourceSpec(name="json", prob=1.0, label="s"), vocab_size=100)
    assert docs.document({"id": "a", "input_ids": [5, 99]}, 0, None) == [5, 99]  # a string id column is no text
    assert docs.document({"id": "b", "input_ids": []}, 1, None) is None  # skipped, said once
    for ids, bad in (([5, -3], -3), ([100, 5], 100), ([-1, 250], 250)):
        with pytest.raises(UserError, match=f"row 2 holds token id {bad}, outside the tokenizer's 100 ids"):
            docs.document({"id": "c", "input_ids": ids}, 2, None)
    with pytest.raises(UserError, match="row 3's 'input_ids' is not a list of token ids"):
        docs.document({"id": "d", "input_ids": [1.5]}, 3, None)
