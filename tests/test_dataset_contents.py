"""A packed dataset's contents and manifest are checked where they are used: the sha256 of each chunk of each token
file, recorded as the build writes (also across a resume), is verified by the build before it reuses a dataset, at
the start of training and by evaluation; a manifest of the wrong shape is one line naming the file and what it lacks,
in each of them, never a KeyError or 'built from other inputs'."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sparknet.common.errors import UserError
from sparknet.config.mix import load_config
from sparknet.data.packed.build import BuildSpec, build_dataset
from tests.helpers import build_position, run_script, stop_build_after_saves, train_args, write_config, write_jsonl

FIX = "build_dataset_v5.py --overwrite true"
SMALL_CHUNK = 16 * 128 * 2  # 16 blocks of 128 uint16 tokens: the small datasets here span many chunks


def _spec(corpus_config: Path, tokenizer_dir: Path, out: Path, **kw: object) -> BuildSpec:
    values = dict(config=load_config(corpus_config), tokenizer=str(tokenizer_dir), output_dir=out,
                  target_tokens=30_000, val_tokens=3_000, block_size=128, seed=0, num_workers=0)
    return BuildSpec(**{**values, **kw})  # type: ignore[arg-type]


def _chunk_hashes(path: Path, chunk_bytes: int) -> list[str]:
    """The sha256 of each `chunk_bytes` of the file, computed here with nothing but hashlib."""
    data = path.read_bytes()
    return [hashlib.sha256(data[i:i + chunk_bytes]).hexdigest() for i in range(0, len(data), chunk_bytes)]


def _recorded(folder: Path, split: str) -> dict:
    return json.loads((folder / "manifest.json").read_text())["splits"][split]["sha256"]


def _damage(path: Path, fraction: float = 0.3, token: int = 7) -> None:
    """Overwrites the first `fraction` of a token file with one token id: the same size, other bytes."""
    tokens = np.memmap(path, dtype=np.uint16, mode="r+")
    tokens[: int(len(tokens) * fraction)] = token
    tokens.flush()
    del tokens


def _one_line(message: str) -> str:
    assert "\n" not in message.strip(), message
    return message


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mix config of one source of 10,000 short documents: a build saves its position often, mid-chunk."""
    import random
    from pydoc_data.topics import topics

    words = " ".join(topics.values()).split()
    rng = random.Random(5)
    folder = tmp_path_factory.mktemp("short")
    texts = [f"doc-{i}: " + " ".join(rng.choices(words, k=rng.randint(5, 60))) for i in range(10_000)]
    data = write_jsonl(folder / "short.jsonl", texts)
    return write_config(folder / "mix.json", [{"name": "json", "prob": 1.0, "data_files": str(data)}])


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr("sparknet.data.packed.dataset.CHUNK_BYTES", SMALL_CHUNK)
    return SMALL_CHUNK


@pytest.fixture
def copy(tiny_dataset: Path, tmp_path: Path) -> Path:
    """A copy of the session's tiny dataset, to damage."""
    out = tmp_path / "ds"
    shutil.copytree(tiny_dataset, out)
    return out


def test_the_manifest_holds_the_sha256_of_each_chunk_of_each_token_file(
    short_documents: Path, tokenizer_dir: Path, tmp_path: Path, tiny_dataset: Path, small_chunks: int
) -> None:
    out = tmp_path / "ds"
    build_dataset(_spec(short_documents, tokenizer_dir, out))
    for split in ("train", "val"):
        recorded = _recorded(out, split)
        assert recorded["chunk_blocks"] == 16, recorded
        assert recorded["chunks"] == _chunk_hashes(out / f"{split}.bin", small_chunks), split
        assert len(recorded["chunks"]) >= 2, split  # and the last is a partial one: 234 and 24 blocks
    for split in ("train", "val"):  # the default chunk: a file this small is one chunk, its sha256
        assert _recorded(tiny_dataset, split)["chunks"] == [
            hashlib.sha256((tiny_dataset / f"{split}.bin").read_bytes()).hexdigest()]


def test_a_resumed_build_records_the_hashes_of_one_never_stopped(
    short_documents: Path, tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_chunks: int
) -> None:
    """Stopped (Ctrl-C) just after the first save, then later mid-chunk: the resumed build re-hashes what it keeps
    and records the hashes of the build never stopped, which hashlib gives for its files."""
    reference = tmp_path / "reference"
    build_dataset(_spec(short_documents, tokenizer_dir, reference, target_tokens=300_000))
    seen = []  # the training blocks at each save, to say what happened when no stop came
    stops = [lambda state: state["written"]["train"] > 0,
             lambda state: seen.append(state["written"]["train"]) or (
                 state["written"]["train"] > 16 and state["written"]["train"] % 16 != 0)]
    stop_build_after_saves(monkeypatch, stops)
    out, building = tmp_path / "ds", tmp_path / ".ds.building"
    spec = _spec(short_documents, tokenizer_dir, out, target_tokens=300_000, checkpoint_seconds=1e-6)
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            build_dataset(spec)
        assert build_position(building)["written"]["train"] > 0, seen
    build_dataset(spec)
    assert not stops
    for split in ("train", "val"):
        assert (out / f"{split}.bin").read_bytes() == (reference / f"{split}.bin").read_bytes()
        assert _recorded(out, split) == _recorded(reference, split)
        assert _recorded(out, split)["chunks"] == _chunk_hashes(out / f"{split}.bin", small_chunks)


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_damaged_token_file_is_never_nothing_to_do_and_overwrite_rebuilds_it(
    short_documents: Path, tokenizer_dir: Path, tmp_path: Path, split: str, small_chunks: int,
    caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "ds"
    spec = _spec(short_documents, tokenizer_dir, out)
    build_dataset(spec)
    good = (out / f"{split}.bin").read_bytes()
    tokens = np.memmap(out / f"{split}.bin", dtype=np.uint16, mode="r+")
    block, blocks = (40, "32..47") if split == "train" else (20, "16..23")  # val: its last chunk, a partial one
    tokens[block * 128 + 5] ^= 1  # one bit
    tokens.flush()
    del tokens
    with caplog.at_level("INFO"), pytest.raises(UserError) as error:
        build_dataset(spec)
    message = _one_line(str(error.value))
    assert f"{split}.bin does not match the sha256 in its manifest.json at blocks {blocks}" in message, message
    assert "--overwrite true" in message and "other inputs" not in message
    assert "nothing to do" not in caplog.text
    build_dataset(_spec(short_documents, tokenizer_dir, out, overwrite=True))
    assert (out / f"{split}.bin").read_bytes() == good


def test_overwriting_30_percent_of_train_bin_with_one_token_is_refused_by_the_build(
    copy: Path, corpus_config: Path, tokenizer_dir: Path, tiny_dataset: Path
) -> None:
    """The issue's case, on the session's dataset (100k tokens) as the build made it."""
    _damage(copy / "train.bin")
    spec = _spec(corpus_config, tokenizer_dir, copy, target_tokens=100_000, val_tokens=4_000)
    with pytest.raises(UserError) as error:
        build_dataset(spec)
    assert "train.bin does not match the sha256 in its manifest.json" in _one_line(str(error.value))
    build_dataset(BuildSpec(**{**spec.__dict__, "overwrite": True}))
    assert (copy / "train.bin").read_bytes() == (tiny_dataset / "train.bin").read_bytes()


@pytest.mark.parametrize("split", ["train", "val"])
def test_training_and_evaluation_refuse_a_damaged_split_in_one_line(copy: Path, split: str) -> None:
    """In this process: the packed plan (what both the trainer and a resume open) and evaluation's documents."""
    from sparknet.eval.data import DataRequest, load_documents
    from sparknet.train.data_plan import packed_plan

    _damage(copy / f"{split}.bin")
    with pytest.raises(UserError) as error:
        packed_plan(str(copy), None, None)
    message = _one_line(str(error.value))
    assert f"{copy / split}.bin does not match the sha256 in its manifest.json at blocks 0.." in message, message
    assert FIX in message
    with pytest.raises(UserError) as error:
        load_documents(DataRequest(str(copy), split=split))
    assert f"{split}.bin does not match the sha256" in _one_line(str(error.value))


def test_a_damaged_val_sources_bin_is_refused_by_training_and_the_build_and_overwrite_rebuilds_it(
    copy: Path, corpus_config: Path, tokenizer_dir: Path, tiny_dataset: Path
) -> None:
    """One validation token credited to the other source (a valid id, so only the hashes can tell): the packed plan
    refuses in one line naming val_sources.bin, the build does not take the dataset as already built, and
    --overwrite true writes the build's bytes back."""
    from sparknet.train.data_plan import packed_plan

    ids = np.memmap(copy / "val_sources.bin", dtype=np.uint16, mode="r+")
    ids[100] = 1 - ids[100]
    ids.flush()
    del ids
    with pytest.raises(UserError) as error:
        packed_plan(str(copy), None, None)
    message = _one_line(str(error.value))
    assert "val_sources.bin does not match the sha256 in its manifest.json at blocks 0.." in message, message
    assert FIX in message
    spec = _spec(corpus_config, tokenizer_dir, copy, target_tokens=100_000, val_tokens=4_000)
    with pytest.raises(UserError) as error:
        build_dataset(spec)
    assert "val_sources.bin does not match the sha256" in _one_line(str(error.value))
    build_dataset(BuildSpec(**{**spec.__dict__, "overwrite": True}))
    assert (copy / "val_sources.bin").read_bytes() == (tiny_dataset / "val_sources.bin").read_bytes()


@pytest.mark.slow
def test_the_packed_trainer_refuses_a_damaged_train_bin_in_one_line(copy: Path, tmp_path: Path) -> None:
    _damage(copy / "train.bin")
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, copy))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"error: {copy}/train.bin does not match the sha256 in its manifest.json" in proc.stderr, proc.stderr
    assert FIX in proc.stderr and not (tmp_path / "ckpt" / "run").exists()


@pytest.mark.slow
def test_eval_perplexity_refuses_a_damaged_val_bin_in_one_line(copy: Path, random_model: Path,
                                                               tmp_path: Path) -> None:
    _damage(copy / "val.bin")
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data", copy,
                      "--context", 32, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"error: {copy}/val.bin does not match the sha256 in its manifest.json" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _without(manifest: dict, *path: str) -> dict:
    target = manifest
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return manifest


def _replaced(manifest: dict, path: tuple[str, ...], value: object) -> dict:
    target = manifest
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return manifest


DAMAGED = "is damaged (it is not the manifest the build wrote: cut or edited since)"
GARBLED = {
    "not an object": (lambda m: [m], DAMAGED),
    "no block_size": (lambda m: _without(m, "block_size"), DAMAGED),
    "block_size a string": (lambda m: {**m, "block_size": "128"}, DAMAGED),
    "no val split": (lambda m: _without(m, "splits", "val"), DAMAGED),
    "no hashes": (lambda m: _without(m, "splits", "train", "sha256"), DAMAGED),
    "hashes missing": (lambda m: _replaced(m, ("splits", "train", "sha256", "chunks"), []), DAMAGED),
    "no tokenizer path": (lambda m: _without(m, "tokenizer", "path"), DAMAGED),
    # of the right shape, a count changed: a shape check let it through, and the build took it as its own
    "a count changed": (lambda m: _replaced(m, ("splits", "train", "blocks"), m["splits"]["train"]["blocks"] - 1),
                        DAMAGED),
    "no seal": (lambda m: _without(m, "manifest_sha256"), DAMAGED),
    "no format version": (lambda m: _without(m, "format_version"), DAMAGED),
}


def _garble(folder: Path, case: str) -> str:
    change, said = GARBLED[case]
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps(change(manifest)))
    return said


@pytest.mark.parametrize("case", list(GARBLED))
def test_a_manifest_of_the_wrong_shape_is_one_line_in_the_build_training_and_evaluation(
    copy: Path, corpus_config: Path, tokenizer_dir: Path, case: str
) -> None:
    from sparknet.eval.data import DataRequest, load_documents
    from sparknet.train.data_plan import packed_plan

    said = _garble(copy, case)
    spec = _spec(corpus_config, tokenizer_dir, copy, target_tokens=100_000, val_tokens=4_000)
    for call in (lambda: build_dataset(spec), lambda: packed_plan(str(copy), None, None),
                 lambda: load_documents(DataRequest(str(copy)))):
        with pytest.raises(UserError) as error:
            call()
        message = _one_line(str(error.value))
        assert f"{copy / 'manifest.json'} {said}" in message and FIX in message, message
        assert "other inputs" not in message
    if case == "no block_size":  # and --overwrite true rebuilds it (one case: a build takes seconds)
        build_dataset(BuildSpec(**{**spec.__dict__, "overwrite": True}))
        assert packed_plan(str(copy), None, None).train_blocks == 100_000 // 128


@pytest.mark.slow
def test_the_scripts_say_a_manifest_is_garbled_in_one_line(copy: Path, random_model: Path, tiny_dataset: Path,
                                                           corpus_config: Path, tokenizer_dir: Path,
                                                           tmp_path: Path) -> None:
    """Each script says a UserError of the manifest in one line; which garbling raises one, for each of the
    three readers, is the test above (every case)."""
    said = _garble(copy, "not an object")
    runs = {
        "build_dataset_v5.py": ["--config", corpus_config, "--tokenizer_dir", tokenizer_dir, "--output_dir", copy,
                                "--target_tokens", 100_000, "--val_tokens", 4_000, "--num_workers", 0],
        "train_sparknet_v5.py": train_args(tmp_path, tiny_dataset, dataset_dir=str(copy)),
        "eval_perplexity.py": ["--models", json.dumps([str(random_model)]), "--data", copy, "--context", 32,
                               "--eval_dir", tmp_path / "eval"],
    }
    for script, args in runs.items():
        proc = run_script(script, *args)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (script, proc.stderr[-3000:])
        assert f"error: {copy / 'manifest.json'} {said}" in proc.stderr and FIX in proc.stderr, (script, proc.stderr)
