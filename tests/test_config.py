"""Mix configs: every mistake exits non-zero with one message naming the file and JSON path, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparknet.config.mix import ConfigError, load_config, parse_config
from tests.helpers import run_script, write_config, write_jsonl

GOOD = {"name": "json", "prob": 1.0, "data_files": "PLACEHOLDER"}


@pytest.fixture
def data_file(tmp_path: Path) -> str:
    return str(write_jsonl(tmp_path / "docs.jsonl", ["hello world"] * 3))


def _cases(data_file: str) -> list[tuple[str, object, str]]:
    good = {**GOOD, "data_files": data_file}
    top = {"seed": 1, "context_length": 128, "target_tokens": 1000}
    return [
        ("invalid-json", '{"seed": 1,\n  "mix": [}', "invalid JSON (expecting value) at line 2, column 11"),
        ("not-object", [1, 2], "expected a JSON object"),
        ("missing-key", {**top}, "mix: missing required key"),
        (
            "unknown-top",
            {**top, "mix": [good], "contxt_length": 5},
            "contxt_length: unknown key; did you mean 'context_length'?",
        ),
        (
            "unknown-source-key",
            {**top, "mix": [{**good, "probb": 1}]},
            "mix[0].probb: unknown key; did you mean 'prob'?",
        ),
        (
            "missing-prob",
            {**top, "mix": [{"name": "json", "data_files": data_file}]},
            "mix[0].prob: missing required key",
        ),
        (
            "prob-string",
            {**top, "mix": [{**good, "prob": "0.5"}]},
            'mix[0].prob: expected a finite number > 0, got "0.5"',
        ),
        ("prob-zero", {**top, "mix": [good, {**good, "prob": 0}]}, "mix[1].prob: expected a finite number > 0, got 0"),
        ("prob-negative", {**top, "mix": [{**good, "prob": -1}]}, "mix[0].prob: expected a finite number > 0, got -1"),
        (
            "prob-nan",
            '{"seed": 1, "context_length": 8, "target_tokens": 8, "mix": [{"name": "x", "prob": NaN}]}',
            "mix[0].prob: expected a finite number > 0, got NaN",
        ),
        (
            "prob-inf",
            '{"seed": 1, "context_length": 8, "target_tokens": 8, "mix": [{"name": "x", "prob": Infinity}]}',
            "mix[0].prob: expected a finite number > 0, got Infinity",
        ),
        ("empty-mix", {**top, "mix": []}, "mix: the mix is empty"),
        ("mix-not-list", {**top, "mix": {"name": "x"}}, "mix: expected a list of sources"),
        ("json-no-files", {**top, "mix": [{"name": "json", "prob": 1}]}, 'mix[0].data_files: a "json" source needs'),
        (
            "missing-file",
            {**top, "mix": [{**good, "data_files": "/nonexistent/x.jsonl"}]},
            "mix[0].data_files: data file '/nonexistent/x.jsonl' does not exist",
        ),
        ("ctx-zero", {**top, "context_length": 0, "mix": [good]}, "context_length: expected a positive integer, got 0"),
        ("ctx-one", {**top, "context_length": 1, "mix": [good]}, "context_length: expected 2 or more tokens, got 1"),
        (
            "ctx-float",
            {**top, "context_length": 1.5, "mix": [good]},
            "context_length: expected a positive integer, got 1.5",
        ),
        (
            "tokens-string",
            {**top, "target_tokens": "1B", "mix": [good]},
            'target_tokens: expected a positive integer, got "1B"',
        ),
        (
            "tokens-bool",
            {**top, "target_tokens": True, "mix": [good]},
            "target_tokens: expected a positive integer, got true",
        ),
        ("name-empty", {**top, "mix": [{**good, "name": ""}]}, "mix[0].name: expected a non-empty string"),
        ("source-not-object", {**top, "mix": ["codelion/x"]}, "mix[0]: expected an object"),
    ]


CASE_NAMES = [name for name, _, _ in _cases("")]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_config_is_one_error_naming_the_file_and_the_json_path(case: str, data_file: str, tmp_path: Path) -> None:
    name, content, message = next(c for c in _cases(data_file) if c[0] == case)
    path = tmp_path / f"{name}.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:") and "\n" not in str(info.value), str(info.value)
    assert message in str(info.value), (name, str(info.value))


def test_a_bad_config_stops_a_script_with_one_line_before_any_work(data_file: str, tmp_path: Path) -> None:
    """What the user sees of any case above: exit 1, the error line, no traceback, nothing written."""
    path = write_config(tmp_path / "bad.json", [{**GOOD, "data_files": data_file, "probb": 1}])
    proc = run_script("train_tokenizer_v5.py", "--config", path, "--output_dir", tmp_path / "tok")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: {path}: mix[0].probb: unknown key; did you mean 'prob'?"), proc.stderr
    assert not (tmp_path / "tok").exists()


def test_missing_config_file_names_the_shipped_ones(tmp_path: Path) -> None:
    proc = run_script("train_tokenizer_v5.py", "--config", "configs/nope.json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "configs/nope.json not found" in proc.stderr and "configs/datasets_v5.json" in proc.stderr


def test_probabilities_are_normalised_and_logged(
    data_file: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = str(write_jsonl(tmp_path / "d2" / "docs.jsonl", ["more words"]))
    path = write_config(
        tmp_path / "c.json",
        [{**GOOD, "data_files": data_file, "prob": 3}, {**GOOD, "data_files": other, "prob": 1}],
    )
    with caplog.at_level("WARNING"):
        cfg = load_config(path)
    assert [s.prob for s in cfg.mix] == [0.75, 0.25]
    assert [s.label for s in cfg.mix] == ["docs#1", "docs#2"]
    assert "normalised to docs#1=0.7500, docs#2=0.2500" in caplog.text


def test_shipped_configs_are_valid(corpus_dir: Path) -> None:
    v5 = load_config("configs/datasets_v5.json")
    assert [(s.name, s.prob) for s in v5.mix] == [
        ("codelion/finepdfs-1B", 0.5),
        ("codelion/dclm-baseline-1B", 0.3),
        ("codelion/fineweb-edu-1B", 0.2),
    ]
    assert (v5.context_length, v5.target_tokens, v5.seed) == (1024, 1_000_000_000, 42)
    # The demo corpus is generated, not committed: point the local sources at the fixture's copy of it.
    for name, labels in [
        ("demo", ["prose", "code"]),
        ("datasets_v1", ["finepdfs-1B", "dclm-baseline-1B", "fineweb-edu-1B", "prose"]),
        ("demo_anneal", ["prose", "code"]),
    ]:
        data = json.loads(Path(f"configs/{name}.json").read_text())
        for entry in [e for mix in [data.get("mix", [])] + [p["mix"] for p in data.get("phases", [])] for e in mix]:
            if "data_files" in entry:
                entry["data_files"] = str(corpus_dir / Path(entry["data_files"]).name)
        cfg = parse_config(data, name)
        assert [s.label for s in cfg.mix] == labels
        assert abs(sum(s.prob for s in cfg.mix) - 1) < 1e-12
    # the worked example of phases: the demo's mix, then the last 20% of the tokens on prose alone
    assert [(p.name, p.share, p.prob_of()) for p in cfg.phases] == [
        ("main", 0.8, {"prose": 0.4, "code": 0.6}), ("anneal", 0.2, {"prose": 1.0})]


def test_defaults_and_optional_keys(data_file: str) -> None:
    cfg = parse_config(
        {
            "seed": 0,
            "context_length": 8,
            "target_tokens": 8,
            "mix": [{"name": "org/ds", "prob": 1, "subset": "en", "text_field": "body"}],
        }
    )
    (src,) = cfg.mix
    assert (src.split, src.subset, src.text_field, src.data_files, src.label) == ("train", "en", "body", None, "ds/en")
    with pytest.raises(ConfigError, match="mix\\[0\\].split: expected a non-empty string"):
        parse_config(
            {"seed": 0, "context_length": 8, "target_tokens": 8, "mix": [{"name": "org/ds", "prob": 1, "split": 3}]}
        )


def _top(mix: list[dict], **top: object) -> dict:
    return {"seed": 1, "context_length": 8, "target_tokens": 8, "mix": mix, **top}


def test_the_same_source_twice_is_refused(data_file: str) -> None:
    """Listed twice, a source would be read twice: every document twice in the dataset."""
    doubled = data_file.replace("/docs.jsonl", "//docs.jsonl")  # the same file, typed differently
    with pytest.raises(ConfigError, match=r"mix\[1\]: the same source as mix\[0\]"):
        parse_config(_top([{**GOOD, "data_files": data_file}, {**GOOD, "data_files": doubled, "prob": 2}]))
    with pytest.raises(ConfigError, match=r"mix\[2\]: the same source as mix\[0\]"):
        parse_config(_top([{"name": "o/d", "prob": 1}, {"name": "o/d", "prob": 1, "split": "x"},
                           {"name": "o/d", "prob": 1, "split": "train"}]))
    # another split or subset of the same Hub dataset is another source
    cfg = parse_config(_top([{"name": "o/d", "prob": 1}, {"name": "o/d", "prob": 1, "subset": "en"}]))
    assert [s.label for s in cfg.mix] == ["d", "d/en"]


def test_a_file_read_twice_is_refused_whatever_the_spelling(data_file: str, tmp_path: Path) -> None:
    """The same file twice in one entry, or in two entries (through a glob, `..`, another split label), would put
    its documents in the data twice and validation documents in training."""
    folder = str(Path(data_file).parent)
    other = str(write_jsonl(tmp_path / "other.jsonl", ["more words"] * 3))
    cases = [
        [{**GOOD, "data_files": [data_file, f"{folder}/../{Path(folder).name}/docs.jsonl"]}],
        [{**GOOD, "data_files": [data_file, f"{folder}/doc?.jsonl"]}],
        [{**GOOD, "data_files": data_file}, {**GOOD, "data_files": f"{folder}/*.jsonl"}],
        [{**GOOD, "data_files": data_file}, {**GOOD, "data_files": data_file, "split": "validation"}],
    ]
    for mix in cases:
        with pytest.raises(ConfigError, match=r"mix\[\d\]\.data_files: the file .*docs\.jsonl is (twice in|in mix)"):
            parse_config(_top(mix))
    # other files, or other columns of one file (text_field), are other sources
    parse_config(_top([{**GOOD, "data_files": data_file}, {**GOOD, "data_files": other}]))
    titled = tmp_path / "titled.jsonl"
    titled.write_text("".join(json.dumps({"title": f"t{i}", "text": "words"}) + "\n" for i in range(3)))
    both = parse_config(_top([{**GOOD, "data_files": str(titled), "text_field": "text"},
                              {**GOOD, "data_files": str(titled), "text_field": "title"}]))
    assert len(both.mix) == 2


def test_labels_are_unique_even_when_a_file_name_looks_numbered(tmp_path: Path) -> None:
    files = [write_jsonl(tmp_path / "a#1.jsonl", ["x"]), write_jsonl(tmp_path / "a.jsonl", ["y"]),
             write_jsonl(tmp_path / "d2" / "a.jsonl", ["z"])]
    cfg = parse_config(_top([{**GOOD, "data_files": str(f)} for f in files]))
    labels = [s.label for s in cfg.mix]
    assert len(set(labels)) == 3, labels
    assert labels == ["a#1", "a#2", "a#3"]


def test_no_label_is_empty_or_holds_a_control_character(tmp_path: Path) -> None:
    """A hidden file's stem is its name after the dot; a newline or escape in a file name is written escaped, so that
    a label never breaks a table row, a log line or a TensorBoard tag."""
    files = [write_jsonl(tmp_path / ".hid.jsonl", ["x"]), write_jsonl(tmp_path / "...jsonl", ["y"]),
             write_jsonl(tmp_path / "two\nlines\x1b.jsonl", ["z"]), write_jsonl(tmp_path / "café.jsonl", ["w"])]
    cfg = parse_config(_top([{**GOOD, "data_files": str(f)} for f in files]))
    assert [s.label for s in cfg.mix] == ["hid", "jsonl", "two\\nlines\\x1b", "café"]


def test_a_duplicate_json_key_is_refused(data_file: str, tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text('{"seed": 1, "context_length": 8, "target_tokens": 8, "mix": [{"name": "json", '
                    f'"data_files": {json.dumps(data_file)}, "prob": 0.5, "prob": 1}}]}}')
    with pytest.raises(ConfigError, match=r"dup.json: key 'prob' appears twice in one object"):
        load_config(path)


def test_whole_numbers_written_as_floats_are_accepted(data_file: str, tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text('{"seed": 1, "context_length": 1024.0, "target_tokens": 1e9, "mix": [{"name": "json", '
                    f'"data_files": {json.dumps(data_file)}, "prob": 1}}]}}')
    cfg = load_config(path)
    assert (cfg.context_length, cfg.target_tokens) == (1024, 10**9)
    assert isinstance(cfg.target_tokens, int)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": 2**32}, "seed: expected an integer from 0 to 4294967295, got 4294967296"),
        ({"target_tokens": 1.5e3 + 0.5}, "target_tokens: expected a positive integer, got 1500.5"),
        ({"mix": [{"name": "json", "prob": 1, "data_files": "DIR"}]}, "is a folder"),
        ({"mix": [{"name": "json", "prob": 1, "data_files": "DIR/*"}]}, "matches only folders"),
        ({"mix": [{"name": "json", "prob": 1, "data_files": "DIR/*.parquet"}]}, "matches no file"),
        ({"mix": [{"name": "json", "prob": 1, "data_files": "DATA", "subset": "en"}]},
         'mix[0].subset: a "json" source has no subsets'),
        ({"mix": [{"name": "json", "prob": 1, "data_files": "DATA", "revision": "v1"}]},
         'mix[0].revision: a "json" source has no revisions: remove "revision"'),
        ({"mix": [{"name": "o/d", "prob": 1, "revision": 3}]},
         "mix[0].revision: expected a non-empty string, got 3 (an integer)"),
        ({"mix": [{"name": "o/d", "prob": 1, "revision": " "}]}, "mix[0].revision: expected a non-empty string"),
    ],
)
def test_odd_values_get_one_clear_line(change: dict, message: str, data_file: str, tmp_path: Path) -> None:
    (tmp_path / "sub" / "inner").mkdir(parents=True)
    text = json.dumps({**_top([{**GOOD, "data_files": data_file}]), **change})
    text = text.replace("DIR", str(tmp_path / "sub")).replace('"DATA"', json.dumps(data_file))
    with pytest.raises(ConfigError) as info:
        parse_config(json.loads(text), "c.json")
    assert str(info.value).startswith("c.json: ") and "\n" not in str(info.value)
    assert message in str(info.value), str(info.value)


def test_paths_typed_two_ways_are_the_same_inputs(data_file: str) -> None:
    """`DIR//docs.jsonl` and `DIR/x/../docs.jsonl` are `DIR/docs.jsonl`: a dataset built from one is not rebuilt
    (nor refused) for the other."""
    folder = str(Path(data_file).parent)
    (Path(folder) / "x").mkdir()
    typed = [data_file, f"{folder}//docs.jsonl", f"{folder}/x/../docs.jsonl"]
    dicts = [parse_config(_top([{**GOOD, "data_files": t}])).to_dict()["mix"] for t in typed]
    assert dicts[0] == dicts[1] == dicts[2]


def test_a_revision_pins_a_hub_source_and_is_recorded_only_when_set() -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    cfg = parse_config(_top([{"name": "o/d", "prob": 1, "revision": "v1.0"}, {"name": "o/e", "prob": 1},
                             {"name": "o/f", "prob": 1, "subset": "en", "revision": sha}]))
    assert [s.revision for s in cfg.mix] == ["v1.0", None, sha]
    assert [s.label for s in cfg.mix] == ["d@v1.0", "e", "f/en@0123456"]
    mix = cfg.to_dict()["mix"]
    assert (mix[0]["revision"], mix[2]["revision"]) == ("v1.0", sha)
    # without a revision the entry is what it was before the key existed: recorded dataset inputs still match
    assert "revision" not in mix[1]
    assert mix[1] == {"name": "o/e", "prob": 1 / 3, "split": "train", "data_files": None, "subset": None,
                      "text_field": None, "label": "e"}


def test_two_revisions_of_one_dataset_are_two_sources() -> None:
    cfg = parse_config(_top([{"name": "o/d", "prob": 1, "revision": "v1"}, {"name": "o/d", "prob": 1, "revision": "v2"},
                             {"name": "o/d", "prob": 1}]))
    assert [s.label for s in cfg.mix] == ["d@v1", "d@v2", "d"]
    same = r"mix\[1\]: the same source as mix\[0\] \(o/d, split 'train', revision 'v1'\)"
    with pytest.raises(ConfigError, match=same):
        parse_config(_top([{"name": "o/d", "prob": 1, "revision": "v1"}, {"name": "o/d", "prob": 2, "revision": "v1"}]))
