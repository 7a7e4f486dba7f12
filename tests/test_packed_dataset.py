"""The static packed dataset: exact token mixture, eos placement, disjoint splits, identical rebuilds, interruption,
bad input, and the memory-mapped reader."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from sparknet.common.errors import UserError
from sparknet.config.mix import load_config
from sparknet.data import PackedDataset
from sparknet.data.packed.build import BuildSpec, build_dataset
from sparknet.data.packed.dataset import FORMAT_VERSION, sealed
from tests.helpers import (
    OFFLINE_ENV,
    build_args,
    build_position,
    build_until,
    encoder_processes,
    run_script,
    stop_build_after_saves,
    tagged_documents,
    write_config,
    write_jsonl,
)

EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Two sources of unique documents with very different lengths; a few hold tricky text."""
    from pydoc_data.topics import topics

    words = " ".join(topics.values()).split()
    rng = random.Random(7)
    folder = tmp_path_factory.mktemp("src")
    docs = {
        "short": [f"short-{i}: " + " ".join(rng.choices(words, k=rng.randint(5, 120))) for i in range(4000)],
        "long": [f"long-{i}: " + " ".join(rng.choices(words, k=rng.randint(300, 1000))) for i in range(900)],
    }
    docs["short"][3] += f" a literal {EOT} inside a document"
    docs["short"][5] += " crlf\r\nand tabs\t and emoji 😀"
    for name, texts in docs.items():
        write_jsonl(folder / f"{name}.jsonl", texts)
    docs["folder"] = [str(folder)]  # type: ignore[list-item]
    return docs


def _config(sources: dict, tmp_path: Path, short: float = 0.7, long: float = 0.3, context: int = 128) -> Path:
    folder = Path(sources["folder"][0])
    mix = [
        {"name": "json", "prob": short, "data_files": str(folder / "short.jsonl")},
        {"name": "json", "prob": long, "data_files": str(folder / "long.jsonl")},
    ]
    return write_config(tmp_path / "mix.json", mix, context_length=context)


def _spec(cfg: Path, out: Path, tokenizer_dir: Path, **kw: object) -> BuildSpec:
    args = dict(
        config=load_config(cfg),
        tokenizer=str(tokenizer_dir),
        output_dir=out,
        target_tokens=400_000,
        val_tokens=10_000,
        block_size=128,
        seed=3,
        num_workers=0,
    )
    args.update(kw)
    return BuildSpec(**args)  # type: ignore[arg-type]


def _segments(tokens: np.ndarray, eos: int) -> list[np.ndarray]:
    """Splits a token stream after every eos; the last piece is what follows the last eos."""
    cuts = np.flatnonzero(tokens == eos) + 1
    return np.split(tokens, cuts)


def _tag(text: str) -> str | None:
    """A document's tag: its source and number ("short-12", "long-3"), when `text` starts one."""
    return match.group(1) if (match := re.match(r"((?:short|long)-\d+): ", text)) else None


def _documents(folder: Path, split: str, tokenizer_dir: Path,
               rests: dict[str, str] | None = None) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """A split's tokens (flat), the document of each token and the documents (tests/helpers.py
    `tagged_documents`: read back from the tags their texts start with, and the `rests` of cut ones)."""
    from sparknet.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir))
    tokens = np.asarray(PackedDataset(folder, split).tokens).reshape(-1)
    owner, docs = tagged_documents(tokens, 128, tok.eos_token_id,
                                   lambda ids: tok.decode(ids, skip_special_tokens=True), _tag, rests)
    return tokens, owner, docs


def _rests(folder: Path, sources: dict, tokenizer_dir: Path) -> tuple[list[dict], dict[str, str]]:
    """The validation split's documents, and the text of the rest of each one it cut (by tag), which the training
    split starts with (untagged)."""
    from sparknet.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir))
    full = {_tag(text): text for name in ("short", "long") for text in sources[name]}
    _, _, val_docs = _documents(folder, "val", tokenizer_dir)
    rests = {}
    for doc in val_docs:
        ids = tok.encode(full[doc["tag"]], add_special_tokens=False) + [tok.eos_token_id]
        if doc["tokens"] < len(ids):
            rests[doc["tag"]] = tok.decode(ids[doc["tokens"]:], skip_special_tokens=True)
    return val_docs, rests


@pytest.fixture(scope="module")
def built(sources: dict, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("built")
    out = tmp / "ds"
    build_dataset(_spec(_config(sources, tmp), out, tokenizer_dir, num_workers=2))
    return out


def test_realised_token_shares_match_the_requested_ones(built: Path) -> None:
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["complete"] and manifest["exhausted_sources"] == []
    for split in ("train", "val"):
        for label, want in (("short", 0.7), ("long", 0.3)):
            got = manifest["splits"][split]["sources"][label]
            assert got["requested_share"] == pytest.approx(want)
            tolerance = 0.005 if split == "train" else 0.05  # val is only ~80 documents
            assert abs(got["share"] - want) <= tolerance, (split, label, got)
    train = manifest["splits"]["train"]
    assert train["blocks"] == 400_000 // 128 and train["tokens"] == train["blocks"] * 128
    assert sum(s["tokens"] for s in train["sources"].values()) == train["tokens"]
    assert manifest["splits"]["val"]["blocks"] == -(-10_000 // 128)
    assert manifest["dtype"] == "uint16" and manifest["block_size"] == 128
    assert len(manifest["tokenizer"]["sha256"]) == 64 and manifest["build_seconds"] > 0


def test_each_validation_token_is_labelled_with_the_source_its_text_came_from(built: Path, tokenizer_dir: Path) -> None:
    """val_sources.bin against the text: every document of these sources starts with its source's name ("short-",
    "long-"), so the owner of each validation token is read back from the decoded text, and its recorded id must
    name that source; packing joins documents of both sources in blocks, so blocks of mixed sources are checked."""
    val = PackedDataset(built, "val")
    assert val.source_labels == ["short", "long"] and val.source_ids is not None
    assert val.source_ids.shape == val.tokens.shape
    _, owner, docs = _documents(built, "val", tokenizer_dir)
    ids = val.source_ids.reshape(-1)
    source = np.array([val.source_labels.index(doc["tag"].split("-")[0]) for doc in docs])
    assert (owner >= 0).all() and np.array_equal(source[owner], ids)
    mixed_blocks = {int(b) for b in range(len(val)) if len(set(val.source_ids[b].tolist())) > 1}
    assert len(docs) > 40 and len(mixed_blocks) > 10  # documents of both sources, and blocks joining them
    counts = np.bincount(ids, minlength=2)
    manifest = val.manifest["splits"]["val"]["sources"]
    assert counts.tolist() == [manifest["short"]["tokens"], manifest["long"]["tokens"]]


def test_an_eos_only_where_a_document_ends_none_missing_and_no_token_in_both_splits(
    built: Path, sources: dict, tokenizer_dir: Path
) -> None:
    """Read back from the text alone: every document of the validation split is its document's start (the whole,
    or the first tokens of one the hold-out cut), the training split holds the rest of each cut one and every other
    document, whole (a long one in pieces that end with their blocks), each once and in its source's order; every
    <|endoftext|> in train.bin ends a document, none is forged inside one."""
    from sparknet.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir))
    full = {_tag(text): text for name in ("short", "long") for text in sources[name]}
    val_docs, cut = _rests(built, sources, tokenizer_dir)
    val = {doc["tag"]: doc for doc in val_docs}
    held = json.loads((built / "manifest.json").read_text())["splits"]["val"]["sources"]
    assert sum(source["documents_cut"] for source in held.values()) == len(cut) > 5
    tokens, owner, train_docs = _documents(built, "train", tokenizer_dir, rests=cut)
    assert (owner >= 0).all()
    unfinished = 0
    for k, doc in enumerate(train_docs):
        expected = cut[doc["tag"]] if doc["rest"] else full[doc["tag"]]  # the whole rest of a cut one
        ends = np.flatnonzero((owner == k) & (tokens == tok.eos_token_id))
        if len(ends):  # its one eos is its last token (none forged where a piece ends), and it is whole
            assert ends.tolist() == [np.flatnonzero(owner == k)[-1]] and doc["text"] == expected, doc["tag"]
        else:  # cut by the end of the split (a long one may still have pieces to come)
            assert expected.startswith(doc["text"]), doc["tag"]
            unfinished += 1
    assert unfinished <= 2  # one per source at most
    assert sum(doc["rest"] for doc in train_docs) == len(cut) and max(doc["pieces"] for doc in train_docs) > 1
    assert (tokens == tok.eos_token_id).sum() == len(train_docs) - unfinished  # an eos where a document ends only
    whole_val = {tag for tag in val if tag not in cut}
    assert not whole_val & {doc["tag"] for doc in train_docs}
    for name in ("short", "long"):  # each source read in order, none skipped
        order = [int(tag.split("-")[1]) for tag in [*whole_val, *(doc["tag"] for doc in train_docs)]
                 if tag.startswith(name)]
        assert sorted(order) == list(range(len(order))), name


def test_literal_end_of_text_inside_a_document_is_not_a_separator(sources: dict, tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    from sparknet.data.encoding.packer import DocumentEncoder

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    enc = DocumentEncoder(tok.backend_tokenizer.to_str(), tok.eos_token_id, np.uint16)
    flat, lengths = enc([sources["short"][3], "x"])
    assert (flat == tok.eos_token_id).sum() == 2 and flat[lengths[0] - 1] == tok.eos_token_id
    assert tok.decode(flat[: lengths[0] - 1].tolist()) == sources["short"][3]


def test_rebuild_is_byte_identical_whatever_the_workers(
    built: Path, sources: dict, tokenizer_dir: Path, tmp_path: Path
) -> None:
    again = tmp_path / "again"
    build_dataset(_spec(_config(sources, built.parent), again, tokenizer_dir, num_workers=0))
    for name in ("train.bin", "val.bin"):
        assert (again / name).read_bytes() == (built / name).read_bytes()
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (built, again))
    for m in (a, b):
        m.pop("build_seconds")
        m.pop("manifest_sha256")  # the seal covers the build's time
    assert a == b


@pytest.mark.slow
def test_a_build_stopped_after_a_save_resumes_to_the_bytes_of_one_never_stopped(
    built: Path, sources: dict, tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C (KeyboardInterrupt) just after the build saved its position, twice in the training split: the same
    call then resumes, and the files and manifest are those of the build never stopped (the `built` fixture, made
    with encoder processes). In this process; the end-to-end kill -9 and Ctrl-C of the script are
    test_an_interrupted_build_resumes_and_writes_the_same_bytes."""
    stops = [lambda state: state["written"]["train"] > 100, lambda state: state["written"]["train"] > 1500]
    stop_build_after_saves(monkeypatch, stops)
    out, building = tmp_path / "ds", tmp_path / ".ds.building"
    spec = _spec(_config(sources, built.parent), out, tokenizer_dir, checkpoint_seconds=1e-6)
    for least in (100, 1500):
        with pytest.raises(KeyboardInterrupt):
            build_dataset(spec)
        assert build_position(building)["written"]["train"] > least and not out.exists()
    manifest = build_dataset(spec)
    assert not stops and not building.exists()
    for name in ("train.bin", "val.bin", "val_sources.bin", "position.json"):
        assert (out / name).read_bytes() == (built / name).read_bytes(), name
    expected = json.loads((built / "manifest.json").read_text())
    for m in (manifest, expected):
        m.pop("build_seconds")
        m.pop("manifest_sha256")  # the seal covers the build's time
    assert manifest == expected


def test_same_inputs_again_is_a_no_op_and_other_inputs_are_refused(
    built: Path, sources: dict, tokenizer_dir: Path, tmp_path: Path
) -> None:
    before = (built / "manifest.json").read_bytes()
    build_dataset(_spec(_config(sources, built.parent), built, tokenizer_dir))
    assert (built / "manifest.json").read_bytes() == before
    with pytest.raises(UserError, match="built from other inputs .*target_tokens: 400000 -> 100000.*--overwrite"):
        build_dataset(_spec(_config(sources, built.parent), built, tokenizer_dir, target_tokens=100_000))
    assert (built / "manifest.json").read_bytes() == before


def test_reader_gives_blocks_for_the_trainer(built: Path) -> None:
    ds = PackedDataset(built, "train")
    item = ds[len(ds) - 1]
    assert len(ds) == 400_000 // 128 and item["input_ids"].dtype.is_floating_point is False
    assert item["input_ids"].shape == (128,) and item["input_ids"].dtype.itemsize == 8
    assert (item["labels"] == item["input_ids"]).all()
    raw = np.fromfile(built / "train.bin", dtype=np.uint16).reshape(-1, 128)
    assert item["input_ids"].tolist() == raw[-1].tolist()


def test_opening_a_1b_token_dataset_copies_nothing(tiny_dataset: Path, tmp_path: Path) -> None:
    import psutil

    from sparknet.data.packed.dataset import chunk_blocks, chunk_count

    folder = tmp_path / "big"
    folder.mkdir()
    blocks = 1_000_000_000 // 1024
    with (folder / "train.bin").open("wb") as f:
        f.truncate(blocks * 1024 * 2)  # sparse: 2 GB on paper, nothing on disk
    (folder / "val.bin").touch()
    (folder / "val_sources.bin").touch()
    manifest = json.loads((tiny_dataset / "manifest.json").read_text())  # a real one, with other splits
    per_chunk = chunk_blocks(1024 * 2)
    for split, n in (("train", blocks), ("val", 0)):  # opening reads no hash: these stand in for them
        hashes = {"chunk_blocks": per_chunk, "chunks": ["0" * 64] * chunk_count(n, per_chunk)}
        manifest["splits"][split].update(blocks=n, tokens=n * 1024, sha256=hashes)
    manifest["splits"]["val"]["source_ids"]["sha256"] = hashes
    (folder / "manifest.json").write_text(json.dumps(sealed({**manifest, "block_size": 1024})))
    rss_before = psutil.Process().memory_info().rss
    t = time.perf_counter()
    ds = PackedDataset(folder, "train")
    opened = time.perf_counter() - t
    _ = ds[blocks // 2]["input_ids"].sum()
    assert len(ds) == blocks and opened < 1.0
    assert psutil.Process().memory_info().rss - rss_before < 50 * 2**20  # the 2 GB file is not read in


@pytest.mark.slow
def test_exhausted_source_is_filled_by_the_others_and_recorded(
    sources: dict, tokenizer_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(sources, tmp_path, short=0.8, long=0.2)  # the short source holds ~0.65M tokens: too few
    with caplog.at_level("WARNING"):
        manifest = build_dataset(_spec(cfg, tmp_path / "dry", tokenizer_dir, target_tokens=1_200_000))
    # the size asked, but not the mix: never "complete"
    assert manifest["exhausted_sources"] == ["short"] and not manifest["complete"]
    assert manifest["shares_missed"] == {"train": ["short", "long"]}
    assert "short ran dry before reaching their share; the other sources filled the gap" in caplog.text
    assert "the train split misses the mix: short" in caplog.text
    train = manifest["splits"]["train"]
    assert train["tokens"] == 1_200_000 // 128 * 128 and train["sources"]["long"]["share"] > 0.3
    with pytest.raises(UserError, match=r"source 'short' ran dry before reaching its share, in the build's train "
                                        r"split \(ON_EXHAUSTED=fail\)"):
        build_dataset(_spec(cfg, tmp_path / "strict", tokenizer_dir, target_tokens=1_200_000, on_exhausted="fail"))
    assert not (tmp_path / "strict").exists()


@pytest.mark.slow
def test_killed_build_is_not_taken_as_complete_and_a_rerun_completes(
    sources: dict, tokenizer_dir: Path, tmp_path: Path
) -> None:
    cfg = _config(sources, tmp_path)
    out = tmp_path / "ds"
    building = tmp_path / ".ds.building"
    argv = [
        sys.executable,
        "scripts/build_dataset_v5.py",
        *map(str, build_args(cfg, out, tokenizer_dir, "--target_tokens", 1_000_000)),
    ]
    proc = subprocess.Popen(
        argv, env={**os.environ, **OFFLINE_ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 60
    while not (building / "train.bin").exists() and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert building.exists() and not (building / "manifest.json").exists(), "the build finished before the kill"
    assert not out.exists()
    with pytest.raises(UserError, match="does not exist"):
        PackedDataset(out)
    rerun = run_script("build_dataset_v5.py", *build_args(cfg, out, tokenizer_dir, "--target_tokens", 1_000_000))
    assert rerun.returncode == 0, rerun.stderr
    assert "interrupted build" in rerun.stderr and not building.exists()
    assert len(PackedDataset(out)) == 1_000_000 // 128


def test_bad_inputs_are_one_error_and_leave_nothing(sources: dict, tokenizer_dir: Path, tmp_path: Path) -> None:
    """The build's own checks, in this process: each a UserError naming the problem, before anything is written."""
    from transformers import AutoTokenizer

    cfg = _config(sources, tmp_path)
    out = tmp_path / "ds"
    no_text = tmp_path / "notext.jsonl"
    no_text.write_text(json.dumps({"id": 1, "title": "t", "url": "u"}) + "\n")
    bad_cfg = write_config(tmp_path / "notext.json", [{"name": "json", "prob": 1, "data_files": str(no_text)}])
    big = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    big.add_tokens([f"zz{i}qq" for i in range(66_000)])
    big.save_pretrained(str(tmp_path / "bigtok"))
    cases = [
        (_spec(cfg, out, tmp_path / "missing-tok"), "tokenizer folder"),
        (_spec(bad_cfg, out, tokenizer_dir), "columns found: id (int), title (str), url (str)"),
        (_spec(cfg, out, tokenizer_dir, block_size=256), "BLOCK_SIZE=256 exceeds the model's context of 128"),
        (_spec(cfg, out, tmp_path / "bigtok", dtype="uint16"), "overflows uint16"),
    ]
    for spec, message in cases:
        with pytest.raises(UserError) as error:
            build_dataset(spec)
        assert message in str(error.value) and "\n" not in str(error.value), str(error.value)
        assert not out.exists() and not (tmp_path / ".ds.building").exists()


def test_bad_inputs_stop_the_script_with_one_line_and_leave_nothing(sources: dict, tokenizer_dir: Path,
                                                                    tmp_path: Path) -> None:
    """What the user sees of a bad input (any of the above, and the checks of the constants and flags before the
    imports): exit 1 (2 for a flag that does not parse), the error line, no traceback, nothing written."""
    cfg = _config(sources, tmp_path)
    out = tmp_path / "ds"
    cases = [
        (build_args(cfg, out, tmp_path / "missing-tok"), "tokenizer folder"),
        (build_args(tmp_path / "nope.json", out, tokenizer_dir), "config file"),
        (build_args(cfg, out, tokenizer_dir, "--block_size", 0), "BLOCK_SIZE=0: expected 2 or more tokens"),
        ([*build_args(cfg, out, tokenizer_dir), "--val_tokens", 0], "VAL_TOKENS=0: expected a positive number"),
        (build_args(cfg, out, tokenizer_dir, "--target_tokens", "lots"), "--target_tokens: expected an integer"),
    ]
    for args, message in cases:
        proc = run_script("build_dataset_v5.py", *args)
        assert proc.returncode == (2 if message.startswith("--") else 1), (message, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert not out.exists() and not (tmp_path / ".ds.building").exists()


def test_edited_local_data_is_another_input(sources: dict, tokenizer_dir: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(sources["folder"][0], folder)
    cfg = _config({"folder": [str(folder)]}, tmp_path)
    build_dataset(_spec(cfg, tmp_path / "ds", tokenizer_dir, target_tokens=20_000))
    with (folder / "short.jsonl").open("a") as f:
        f.write(json.dumps({"text": "one more document"}) + "\n")
    with pytest.raises(UserError, match="built from other inputs .*local_files_sha256"):
        build_dataset(_spec(cfg, tmp_path / "ds", tokenizer_dir, target_tokens=20_000))


def test_blocks_longer_than_the_tokenizers_training_context_are_built(
    sources: dict, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """The tokenizer was trained from a config with context 128: 256-token blocks are still built, not refused."""
    out = tmp_path / "ds256"
    manifest = build_dataset(_spec(_config(sources, tmp_path, context=256), out, tokenizer_dir, block_size=256,
                                   target_tokens=20_000, val_tokens=2_000))
    assert manifest["block_size"] == 256 and manifest["tokenizer"]["model_max_length"] == 128
    assert PackedDataset(out, "train")[0]["input_ids"].shape == (256,)


@pytest.mark.slow
def test_a_damaged_dataset_is_detected_and_rebuilt_with_overwrite(
    sources: dict, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """A truncated train.bin or a garbled manifest is never taken as 'nothing to do'; --overwrite true rebuilds."""
    out = tmp_path / "ds"

    def spec(**kw: object) -> BuildSpec:
        return _spec(_config(sources, tmp_path), out, tokenizer_dir, target_tokens=20_000, val_tokens=2_000, **kw)

    build_dataset(spec())
    good = {name: (out / name).read_bytes() for name in ("train.bin", "val.bin")}
    with (out / "train.bin").open("r+b") as f:
        f.truncate(1000)
    with pytest.raises(UserError, match="this dataset but it is damaged .*train.bin holds 1000 bytes.*--overwrite"):
        build_dataset(spec())
    build_dataset(spec(overwrite=True))
    assert (out / "train.bin").read_bytes() == good["train.bin"]
    for garbled in ("{not json", '{"format_version": 1, "inputs": 3}', "[]"):
        (out / "manifest.json").write_text(garbled)
        with pytest.raises(UserError, match="--overwrite true"):
            build_dataset(spec())
        build_dataset(spec(overwrite=True))
        assert {name: (out / name).read_bytes() for name in good} == good
    (out / "notes.txt").write_text("mine")  # a folder holding something else is never replaced
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(UserError):
        build_dataset(spec(overwrite=True))
    assert (out / "notes.txt").exists()


def test_the_validation_split_carries_the_mix_and_the_manifest_says_so(
    sources: dict, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """With ~20+ documents of each source in it, validation holds each source within ±2 points of its share."""
    manifest = build_dataset(_spec(_config(sources, tmp_path), tmp_path / "ds", tokenizer_dir, target_tokens=2_000,
                                   val_tokens=110_000))
    val = manifest["splits"]["val"]["sources"]
    assert min(s["documents"] for s in val.values()) >= 20, val
    for label, want in (("short", 0.7), ("long", 0.3)):
        assert val[label]["requested_share"] == pytest.approx(want)
        assert abs(val[label]["share"] - want) <= 0.02, (label, val[label])


@pytest.mark.slow
def test_an_interrupted_build_resumes_and_writes_the_same_bytes(
    sources: dict, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """kill -9 just after the first save, Ctrl-C later in the training split, each followed by the same command:
    the files and manifest equal an uninterrupted build's (which reads on demand), with a shuffle buffer, encoder
    processes and sources read ahead on threads."""
    cfg = _config(sources, tmp_path)
    extra = ("--target_tokens", 600_000, "--shuffle_buffer", 64, "--num_workers", 2, "--checkpoint_seconds", 0.001,
             "--read_ahead", 4)
    reference = tmp_path / "reference"
    proc = run_script("build_dataset_v5.py", *build_args(cfg, reference, tokenizer_dir, *extra[:-2], "--read_ahead",
                                                           0))
    assert proc.returncode == 0, proc.stderr

    out, building = tmp_path / "ds", tmp_path / ".ds.building"
    argv = [sys.executable, "scripts/build_dataset_v5.py", *map(str, build_args(cfg, out, tokenizer_dir, *extra))]
    build_until(argv, building, lambda s: s["written"]["train"] > 0, signal.SIGKILL)
    err = build_until(argv, building, lambda s: s["written"]["train"] > 1000, signal.SIGINT)
    assert "resuming the interrupted build" in err and "resumes it from its last saved position" in err, err[-3000:]
    assert (building / "train.bin").stat().st_size > 0
    proc = run_script("build_dataset_v5.py", *build_args(cfg, out, tokenizer_dir, *extra))
    assert proc.returncode == 0, proc.stderr
    assert "resuming the interrupted build" in proc.stderr and not building.exists()
    for name in ("train.bin", "val.bin", "val_sources.bin"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (reference, out))
    for m in (a, b):
        m.pop("build_seconds")
        m.pop("manifest_sha256")  # the seal covers the build's time
    assert a == b and not [name for name in os.listdir(out) if name.endswith(".tmp")]


# the builds stopped by signals below: 1.2M tokens, so that they save positions along the way
GROUP_BUILD = ("--target_tokens", 1_200_000, "--shuffle_buffer", 64, "--num_workers", 2, "--checkpoint_seconds", 0.001)


@pytest.fixture(scope="module")
def group_reference(sources: dict, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GROUP_BUILD never interrupted, by the script: the bytes each stopped and resumed build must end with."""
    tmp = tmp_path_factory.mktemp("group")
    proc = run_script("build_dataset_v5.py", *build_args(_config(sources, tmp), tmp / "ds", tokenizer_dir,
                                                         *GROUP_BUILD))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "ds"


@pytest.mark.slow
@pytest.mark.parametrize("stops", [
    ((lambda pid: os.kill(encoder_processes(pid)[0], signal.SIGKILL), "error: an encoder process died: killed"),
     (lambda pid: os.killpg(pid, signal.SIGINT), "interrupted by SIGINT: run the same command again")),
    ((lambda pid: os.killpg(pid, signal.SIGTERM), "interrupted by SIGTERM: run the same command again"),
     (lambda pid: os.killpg(pid, signal.SIGHUP), "interrupted by SIGHUP: run the same command again")),
], ids=["killed-encoder-then-ctrl-c", "sigterm-then-sighup"])
def test_a_killed_encoder_or_a_signal_to_the_whole_group_stops_the_build_cleanly_and_it_resumes(
    stops: tuple, sources: dict, group_reference: Path, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """An encoder process killed from outside (as the out-of-memory killer does) stops the build with one line
    instead of hanging; Ctrl-C typed in a terminal, SIGTERM (timeout, systemd) and SIGHUP (the terminal closed) reach
    every process of the group and stop it with its position saved, one line and no temporary file left. The same
    command then finishes, with the bytes of a build never interrupted."""
    cfg = _config(sources, tmp_path)
    extra = GROUP_BUILD
    out, building = tmp_path / "ds", tmp_path / ".ds.building"
    argv = [sys.executable, "scripts/build_dataset_v5.py", *map(str, build_args(cfg, out, tokenizer_dir, *extra))]
    temp = tmp_path / "temp"  # the build's own temporary folder: what it leaves there is seen
    temp.mkdir()
    for kill, said in stops:
        start = (build_position(building) or {"written": {"train": 0}})["written"]["train"]
        proc = subprocess.Popen(argv, env={**os.environ, **OFFLINE_ENV, "TMPDIR": str(temp)}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.time() + 120
            while proc.poll() is None and time.time() < deadline:
                state = build_position(building)
                if state is not None and state["written"]["train"] > start + 500:  # a save of this run
                    kill(proc.pid)
                    break
                time.sleep(0.02)
            _, err = proc.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # a hang must not outlive the test
        assert proc.returncode != 0 and "Traceback" not in err, err
        assert said in err and "resumes it from its last saved position" in err, err
        assert not list(temp.glob("sparknet-tokenizer-*")), said
    proc = run_script("build_dataset_v5.py", *build_args(cfg, out, tokenizer_dir, *extra))
    assert proc.returncode == 0 and "resuming the interrupted build" in proc.stderr, proc.stderr
    for name in ("train.bin", "val.bin"):
        assert (out / name).read_bytes() == (group_reference / name).read_bytes(), name


@pytest.mark.slow
def test_a_read_error_on_the_read_ahead_thread_is_one_line(tokenizer_dir: Path, tmp_path: Path) -> None:
    good = write_jsonl(tmp_path / "good.jsonl", [f"document {i} " * 20 for i in range(6000)])
    rows = write_jsonl(tmp_path / "bad-1.jsonl", [f"row {i} " * 20 for i in range(2000)])
    # read once bad-1 is nearly used up (errors surface a few batches ahead): after positions were saved
    broken = tmp_path / "bad-2.jsonl"
    broken.write_text('{"text": "fine"}\n{not json\n')
    mix = [{"name": "json", "prob": 0.5, "data_files": str(good)},
           {"name": "json", "prob": 0.5, "data_files": [str(rows), str(broken)]}]
    cfg = write_config(tmp_path / "mix.json", mix, context_length=128)
    args = build_args(cfg, tmp_path / "ds", tokenizer_dir, "--read_ahead", 4, "--target_tokens", 400_000,
                        "--block_size", 128, "--checkpoint_seconds", 0.01, "--shuffle_buffer", 0)
    proc = run_script("build_dataset_v5.py", *args)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    # the file being read, named alone (not the source's two files)
    assert f"error: cannot read source 'bad-1' ({broken}): " in proc.stderr, proc.stderr
    # the saved position is kept (for a Hub source a read error is often a passing network failure)
    assert (tmp_path / ".ds.building" / "position.json").is_file() and "resumes it" in proc.stderr
    proc = run_script("build_dataset_v5.py", *args)
    assert "resuming the interrupted build" in proc.stderr and "bad-2.jsonl" in proc.stderr


def test_a_validation_split_too_small_for_whole_long_documents_still_carries_the_mix(
    sources: dict, tokenizer_dir: Path, tmp_path: Path
) -> None:
    """10k validation tokens at 30% hold about two whole long documents: it takes the first 10,000 × 0.3 / 20 = 150
    tokens of each document (the short source's 350), in pieces ended with a block (a block more at most), so that
    each source has its share in 20+ pieces; training takes the rest of each."""
    out = tmp_path / "ds"
    manifest = build_dataset(_spec(_config(sources, tmp_path), out, tokenizer_dir, target_tokens=100_000,
                                   val_tokens=10_000))
    val, train = manifest["splits"]["val"], manifest["splits"]["train"]
    assert [val["sources"][s]["document_cap_tokens"] for s in ("long", "short")] == [150, 350]
    assert val["sources"]["long"]["documents_cut"] >= 12 and val["sources"]["long"]["documents"] >= 20
    for label, want in (("short", 0.7), ("long", 0.3)):
        assert abs(val["sources"][label]["share"] - want) <= 0.03, (label, val["sources"][label])
        assert abs(train["sources"][label]["share"] - want) <= 0.01, (label, train["sources"][label])
    # independently, from the text: the validation documents hold at most their cap and a block (long ones: 150)
    _, _, val_docs = _documents(out, "val", tokenizer_dir)
    assert max(doc["tokens"] for doc in val_docs[:-1]) < 350 + 128
    long_ones = [doc for doc in val_docs[:-1] if doc["tag"].startswith("long-")]
    assert len(long_ones) >= 12 and max(doc["tokens"] for doc in long_ones) < 150 + 128
    _, _, train_docs = _documents(out, "train", tokenizer_dir, _rests(out, sources, tokenizer_dir)[1])
    assert max(doc["tokens"] for doc in train_docs[:-1]) > 600  # a long document's rest, whole


def test_a_ctrl_c_while_the_build_closes_still_stops_its_encoders(tokenizer_dir: Path) -> None:
    """A Ctrl-C that lands while the finished build closes its readers and encoders (seen through a slow Hub:
    the process then waited at exit for its encoders, for good) stops the encoders all the same."""
    from transformers import AutoTokenizer

    from sparknet.data.encoding.encoder_pool import EncoderPool
    from sparknet.data.pipeline import stop

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    pool = EncoderPool(2, tok.backend_tokenizer.to_str(), tok.eos_token_id, np.dtype("uint16"))
    tokens, lengths = pool.submit(["one document", "and another"]).get()
    assert len(lengths) == 2 and tokens.size == int(lengths.sum())
    workers = encoder_processes(os.getpid())
    assert len(workers) == 2

    class InterruptedClose:
        def close(self) -> None:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stop({"src": InterruptedClose()}, pool, clean=True)
    deadline = time.time() + 10
    while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in workers):
        assert time.time() < deadline, "the encoders outlived the interrupted close"
        time.sleep(0.05)


def test_the_token_dtype_follows_the_vocabulary_and_the_dtype_rule() -> None:
    import numpy as np

    from sparknet.data.spec import token_dtype

    assert token_dtype(50257) == np.uint16 and token_dtype(2**16 + 1) == np.uint32
    assert token_dtype(2**16, "uint32") == np.uint32
    with pytest.raises(UserError, match="DTYPE='int8': expected auto, uint16 or uint32"):
        token_dtype(50257, "int8")
    with pytest.raises(UserError, match="a vocabulary of 65537 tokens overflows uint16"):
        token_dtype(2**16 + 1, "uint16")


def test_a_dataset_in_an_older_format_is_refused_in_one_line_naming_both_versions(tiny_dataset: Path,
                                                                                  tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(tiny_dataset, old)
    manifest = json.loads((old / "manifest.json").read_text())
    (old / "manifest.json").write_text(json.dumps({**manifest, "format_version": FORMAT_VERSION - 1}))
    with pytest.raises(UserError, match=f"format version {FORMAT_VERSION - 1}, and this SparkNet reads "
                                        f"{FORMAT_VERSION}: rebuild it"):
        PackedDataset(old, "train")


def test_a_jsonl_line_that_is_not_an_object_stops_the_build_in_one_line(tokenizer_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "some words"}\n' * 3 + '"just a string"\n' + '{"text": "more words"}\n' * 3)
    cfg = write_config(tmp_path / "mix.json", [{"name": "json", "data_files": str(data), "prob": 1.0}])
    # the build as the script runs it (its UserError is the script's one line: test_bad_inputs_stop_the_script_...)
    with pytest.raises(UserError) as caught:
        build_dataset(_spec(cfg, tmp_path / "ds", tokenizer_dir, val_tokens=10_000))
    error = [str(caught.value)]
    assert "\n" not in error[0] and f"({data}): line 4 is \"just a string\", not a JSON object" in error[0], error
    assert "with its text in 'text'" in error[0]


def _prose_and_small_code(corpus_dir: Path, tmp_path: Path, *, rows: int, chars: int, code_prob: float) -> Path:
    """A mix of the corpus's prose and a small code source: its first `rows` documents cut to `chars` characters."""
    from tests.helpers import read_texts

    code = write_jsonl(tmp_path / "code.jsonl",
                       [text[:chars] for text in read_texts(corpus_dir / "code.train.jsonl")[:rows]])
    return write_config(tmp_path / "mix.json", [
        {"name": "json", "prob": 1 - code_prob, "data_files": str(corpus_dir / "prose.train.jsonl")},
        {"name": "json", "prob": code_prob, "data_files": str(code)}])


def test_a_source_that_runs_dry_in_a_build_says_so_as_the_build(corpus_dir: Path, tokenizer_dir: Path,
                                                                tmp_path: Path) -> None:
    """Through the script: a small code source runs dry in the train split. The warning is the build's (its logger
    name, "the build's train split", the mix in manifest.json), not the stream's "the training mix is in the
    metadata": a build has no metadata."""
    config = _prose_and_small_code(corpus_dir, tmp_path, rows=40, chars=400, code_prob=0.3)
    proc = run_script("build_dataset_v5.py", *build_args(config, tmp_path / "ds", tokenizer_dir, "--target_tokens",
                                                         60_000, "--val_tokens", 2_000))
    assert proc.returncode == 0, proc.stderr[-3000:]
    dry = [line for line in proc.stderr.splitlines() if "ran dry after" in line]
    assert len(dry) == 1 and "WARNING sparknet.data.packed.build: source 'code' ran dry after" in dry[0], dry
    assert "in the build's train split" in dry[0] and "manifest.json" in dry[0], dry
    assert "metadata" not in proc.stderr and "stream" not in dry[0], proc.stderr[-3000:]
    assert json.loads((tmp_path / "ds" / "manifest.json").read_text())["exhausted_sources"] == ["code"]
    # every source dry before the target: the end is the build's too
    proc = run_script("build_dataset_v5.py", *build_args(config, tmp_path / "all", tokenizer_dir, "--target_tokens",
                                                         10_000_000, "--val_tokens", 2_000))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ended = [line for line in proc.stderr.splitlines() if "ended after" in line]
    assert len(ended) == 1 and "WARNING sparknet.data.packed.build: the build's train split ended after" in ended[0] \
        and "every source ran dry" in ended[0], proc.stderr[-3000:]


def test_a_source_the_hold_out_used_up_is_refused_by_the_build_before_it_writes(corpus_dir: Path, tokenizer_dir: Path,
                                                                                  tmp_path: Path) -> None:
    """The one check made before a source is trained on, the streaming trainer's and the build's alike
    (data/holdout.py): a source the validation hold-out read to its end, leaving less than a block of it (the rest of
    a document it cut), would give the train split next to nothing (here 0.3% for 50% asked). The build refused
    nothing and wrote a train split without it behind a dry-source warning; now it is one line naming the source, its
    rows and VAL_TOKENS, exit 1, nothing written. With a smaller VAL_TOKENS the same mix builds."""
    config = _prose_and_small_code(corpus_dir, tmp_path, rows=6, chars=200, code_prob=0.5)
    proc = run_script("build_dataset_v5.py", *build_args(config, tmp_path / "ds", tokenizer_dir, "--target_tokens",
                                                         20_000, "--val_tokens", 4_000))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and re.fullmatch(
        r"error: source 'code' \(6 rows\): all its rows read by the validation hold-out, \d+ token\(s\) left to train "
        r"on \(VAL_TOKENS=4,000\): lower VAL_TOKENS, give the source more data, or leave it out of the mix",
        errors[0]), proc.stderr[-3000:]
    assert not (tmp_path / "ds").exists() and not list(tmp_path.glob(".ds*"))
    proc = run_script("build_dataset_v5.py", *build_args(config, tmp_path / "ds", tokenizer_dir, "--target_tokens",
                                                         20_000, "--val_tokens", 200))
    assert proc.returncode == 0, proc.stderr[-3000:]
