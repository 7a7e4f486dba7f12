"""A dataset grows without ever hiding or losing the complete one (issue 49): until the grown dataset is complete,
the complete one stays at OUTPUT_DIR, byte for byte, and readable; a growth that fails, is interrupted or is refused
leaves it as it was; the position a growth goes on from is verified before any work; and one command gives one
dataset whichever way the folder got there, with the scripts' defaults (VAL_TOKENS and SHUFFLE_BUFFER unset).
The scripts run as users run them; the bytes are compared with a fresh build of the same command."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
from pathlib import Path

import pytest

from sparknet.config.mix import load_config
from sparknet.data.packed.build import BuildSpec, build_dataset
from sparknet.data.packed.dataset import PackedDataset
from tests.helpers import run_script, stop_build_after_saves, train_args, write_config, write_jsonl

BLOCK = 64
SMALL, GROWN = 8_000, 16_000  # training tokens before and after a growth
WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud green quick".split()


def _texts(tag: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{tag}{i:05d} " + " ".join(rng.choices(WORDS, k=rng.randint(10, 80))) for i in range(n)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two local sources (about 20k and 30k tokens), a tokenizer, a config of them 50/50 whose target_tokens is
    GROWN, and the same mix in two phases."""
    from transformers import PreTrainedTokenizerFast

    from sparknet.bpe import train_bpe
    from sparknet.tokenizer import EOT

    tmp = tmp_path_factory.mktemp("growth")
    write_jsonl(tmp / "a.jsonl", _texts("a", 400, 1))
    write_jsonl(tmp / "b.jsonl", _texts("b", 600, 2))
    tok = train_bpe(_texts("a", 100, 3) + _texts("b", 100, 4), vocab_size=300)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT).save_pretrained(tmp / "tok")
    mix = [{"name": "json", "prob": 0.5, "data_files": str(tmp / "a.jsonl")},
           {"name": "json", "prob": 0.5, "data_files": str(tmp / "b.jsonl")}]
    one = write_config(tmp / "one.json", mix, context_length=BLOCK, target_tokens=GROWN)
    phased = json.loads(one.read_text())
    phased["phases"] = [{"name": "main", "share": 0.5, "mix": mix},
                        {"name": "b only", "share": 0.5, "mix": [{**mix[1], "prob": 1.0}]}]
    del phased["mix"]
    (tmp / "phased.json").write_text(json.dumps(phased))
    return {"dir": tmp, "tokenizer": tmp / "tok", "one": one, "phased": tmp / "phased.json"}


def _args(setup: dict[str, Path], out: Path, tokens: int, config: str = "one", *extra: object) -> list[object]:
    """The build script's command line with the scripts' defaults (no VAL_TOKENS, no SHUFFLE_BUFFER)."""
    return ["--config", setup[config], "--tokenizer_dir", setup["tokenizer"], "--output_dir", out,
            "--target_tokens", tokens, "--num_workers", 0, *extra]


def _build(setup: dict[str, Path], out: Path, tokens: int, *extra: object) -> str:
    proc = run_script("build_dataset_v5.py", *_args(setup, out, tokens, "one", *extra))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def _files(folder: Path) -> dict[str, str]:
    """Every file of a folder and its sha256: what 'unchanged' means."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _one_error(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The script stopped with one line, no traceback, holding each of `words`."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr[-3000:]
    assert all(word in errors[0] for word in words), errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def small(setup: dict[str, Path]) -> Path:
    """A complete dataset of SMALL training tokens, built with the defaults (read-only: tests copy it)."""
    out = setup["dir"] / "small"
    _build(setup, out, SMALL)
    return out


@pytest.fixture(scope="module")
def fresh(setup: dict[str, Path]) -> Path:
    """A fresh build of GROWN training tokens with the same command line (read-only)."""
    out = setup["dir"] / "fresh"
    _build(setup, out, GROWN)
    return out


def _copy(folder: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(folder, to)
    return to


def test_one_command_gives_one_dataset_grown_or_fresh_and_again_is_nothing_to_do(
        setup: dict[str, Path], small: Path, fresh: Path, tmp_path: Path) -> None:
    """With the defaults (VAL_TOKENS, SHUFFLE_BUFFER unset), the growth command gives the bytes of a fresh build of
    the same command; run again, it has nothing to do; the validation split is the same at every size."""
    grown = _copy(small, tmp_path / "ds")
    err = _build(setup, grown, GROWN)
    assert f"growing it to {GROWN:,}" in err and "other inputs" not in err, err[-3000:]
    for name in ("train.bin", "val.bin", "val_sources.bin", "position.json"):
        assert (grown / name).read_bytes() == (fresh / name).read_bytes(), name
    assert (small / "val.bin").read_bytes() == (fresh / "val.bin").read_bytes()  # the hold-out follows no size
    manifest, expected = (json.loads((f / "manifest.json").read_text()) for f in (grown, fresh))
    for m in (manifest, expected):
        m.pop("build_seconds")
        m.pop("manifest_sha256")  # the seal covers the build's time
    assert manifest == expected
    again = _build(setup, grown, GROWN)
    assert "nothing to do" in again and "refused" not in again, again[-3000:]
    assert not (tmp_path / ".ds.building").exists()
    # the defaults, said: each a line, the same on the grown folder as on a fresh one
    def defaults(err: str) -> list[str]:
        return [line.split(": ", 1)[-1] for line in err.splitlines()
                if "VAL_TOKENS:" in line or "SHUFFLE_BUFFER:" in line]

    said, fresh_said = defaults(again), defaults(_build(setup, tmp_path / "other", GROWN))
    assert len(said) == 2 and said == fresh_said, (said, fresh_said)


def test_a_failed_growth_leaves_the_complete_dataset_readable_and_unchanged(setup: dict[str, Path], small: Path,
                                                                            tmp_path: Path) -> None:
    """ON_EXHAUSTED=fail past the sources' end: the growth fails in one line, the dataset at OUTPUT_DIR is the
    complete one, byte for byte, and trains; the original command then has nothing to do and keeps the failed
    growth's progress (said); another size is refused and deletes nothing."""
    ds = _copy(small, tmp_path / "ds")
    before = _files(ds)
    proc = run_script("build_dataset_v5.py", *_args(setup, ds, 200_000, "one", "--on_exhausted", "fail",
                                                     "--checkpoint_seconds", 0.001))
    _one_error(proc, "ran dry", "ON_EXHAUSTED=fail")
    assert f"the complete {SMALL:,}-token dataset in {ds} is unchanged" in proc.stderr, proc.stderr[-3000:]
    assert _files(ds) == before
    assert len(PackedDataset(ds, "train")) == SMALL // BLOCK  # readable as it was
    again = run_script("build_dataset_v5.py", *_args(setup, ds, SMALL))
    assert again.returncode == 0 and "nothing to do" in again.stderr, again.stderr[-3000:]
    assert "an interrupted build to 200,000 training tokens is kept" in again.stderr, again.stderr[-3000:]
    assert _files(ds) == before and (tmp_path / ".ds.building" / "position.json").is_file()
    smaller = run_script("build_dataset_v5.py", *_args(setup, ds, SMALL // 2))
    _one_error(smaller, "other inputs", "target_tokens", "an interrupted build to 200,000 training tokens is kept")
    assert _files(ds) == before and (tmp_path / ".ds.building" / "position.json").is_file()


def test_an_interrupted_growth_keeps_the_dataset_and_resumes_into_the_fresh_builds_bytes(
        setup: dict[str, Path], small: Path, fresh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A growth stopped after a save of its position (a Ctrl-C): OUTPUT_DIR still holds the complete dataset,
    unchanged; a command of another size is refused and keeps both; the growth command resumes the growth and ends
    at the bytes of a fresh build; a growth to yet another size discards the interrupted one and says so."""
    ds = _copy(small, tmp_path / "ds")
    before = _files(ds)
    spec = BuildSpec(config=load_config(setup["one"]), tokenizer=str(setup["tokenizer"]), output_dir=ds,
                     target_tokens=GROWN, val_tokens=None, block_size=BLOCK, seed=load_config(setup["one"]).seed,
                     shuffle_buffer=json.loads((small / "manifest.json").read_text())["inputs"]["shuffle_buffer"],
                     checkpoint_seconds=1e-6)
    stop_build_after_saves(monkeypatch, [lambda saved: saved["written"]["train"] > SMALL // BLOCK])
    with pytest.raises(KeyboardInterrupt):
        build_dataset(spec)
    monkeypatch.undo()
    building = tmp_path / ".ds.building"
    saved = json.loads((building / "position.json").read_text())["written"]
    written = saved["train"]
    assert SMALL // BLOCK < written < GROWN // BLOCK
    assert _files(ds) == before
    other = run_script("build_dataset_v5.py", *_args(setup, ds, SMALL // 2))
    _one_error(other, "other inputs", f"an interrupted build to {GROWN:,} training tokens is kept")
    assert _files(ds) == before and (building / "position.json").is_file()

    resumed = _build(setup, ds, GROWN)
    assert "resuming its growth" in resumed, resumed[-3000:]
    assert f"after {sum(saved.values()) * BLOCK:,} tokens" in resumed, resumed[-3000:]
    for name in ("train.bin", "val.bin", "val_sources.bin", "position.json"):
        assert (ds / name).read_bytes() == (fresh / name).read_bytes(), name
    assert not building.exists()

    # a growth to another size while one is interrupted: the interrupted one is dropped, in one line
    ds2 = _copy(small, tmp_path / "ds2")
    spec.output_dir = ds2
    stop_build_after_saves(monkeypatch, [lambda saved: saved["written"]["train"] > SMALL // BLOCK])
    with pytest.raises(KeyboardInterrupt):
        build_dataset(spec)
    monkeypatch.undo()
    err = _build(setup, ds2, GROWN + 4 * BLOCK)
    assert "discarded" in err and "target_tokens" in err and "grows from its end" in err, err[-3000:]
    assert len(PackedDataset(ds2, "train")) == (GROWN + 4 * BLOCK) // BLOCK


@pytest.mark.parametrize("damage", ["one count changed", "cut short", "missing"])
def test_a_damaged_or_missing_position_is_one_line_before_any_work(setup: dict[str, Path], small: Path,
                                                                   tmp_path: Path, damage: str) -> None:
    """position.json is verified (its sha256 in the manifest): one count changed in it (still valid JSON), a file
    cut short or a missing one stops the growth in one line naming the file, with advice that keeps the dataset;
    nothing was written and the dataset is as it was."""
    ds = _copy(small, tmp_path / "ds")
    position = ds / "position.json"
    if damage == "one count changed":
        state = json.loads(position.read_text())
        label = next(iter(state["position"]["packer"]["tokens"]))
        state["position"]["packer"]["tokens"][label] += 1
        position.write_text(json.dumps(state, separators=(",", ":")) + "\n")
    elif damage == "cut short":
        position.write_bytes(position.read_bytes()[:100])
    else:
        position.unlink()
    before = _files(ds)
    proc = run_script("build_dataset_v5.py", *_args(setup, ds, GROWN))
    line = _one_error(proc, str(position), "another OUTPUT_DIR", "this dataset is kept")
    assert ("is missing" if damage == "missing" else "is damaged") in line, line
    assert "other inputs" not in line and "packing" not in proc.stderr
    assert _files(ds) == before and not (tmp_path / ".ds.building").exists()
    assert len(PackedDataset(ds, "train")) == SMALL // BLOCK


def test_a_dataset_in_phases_says_it_cannot_grow(setup: dict[str, Path], tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    built = run_script("build_dataset_v5.py", *_args(setup, ds, SMALL, "phased"))
    assert built.returncode == 0, built.stderr[-3000:]
    before = _files(ds)
    proc = run_script("build_dataset_v5.py", *_args(setup, ds, GROWN, "phased"))
    _one_error(proc, "in phases", "cannot grow", "another OUTPUT_DIR")
    assert "other inputs" not in proc.stderr and _files(ds) == before


@pytest.mark.slow
def test_a_run_trained_before_a_growth_is_evaluated_on_the_grown_dataset(setup: dict[str, Path], small: Path,
                                                                         tmp_path: Path) -> None:
    """The validation split of a grown dataset is the one the run held out (byte for byte): eval_perplexity scores
    the run on it, with the same figures as on the dataset before the growth; a dataset rebuilt with other inputs
    is still refused."""
    ds = _copy(small, tmp_path / "ds")
    trained = run_script("train_sparknet_v5.py", *train_args(tmp_path, ds, target_tokens=4 * 4 * BLOCK, eval_steps=4,
                                                             save_steps=4, sample_steps=0))
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = tmp_path / "ckpt" / "run"

    def scored() -> str:
        proc = run_script("eval_perplexity.py", "--models", json.dumps([str(run)]), "--eval_dir", tmp_path / "eval")
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    before = scored()
    assert "bits" in before.lower() and str(run) in before or "run" in before, before
    _build(setup, ds, GROWN)
    assert len(PackedDataset(ds, "train")) == GROWN // BLOCK
    import shutil

    shutil.rmtree(tmp_path / "eval")
    assert scored() == before
    rebuilt = run_script("build_dataset_v5.py", *_args(setup, ds, GROWN, "one", "--seed", 7, "--overwrite", "true"))
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    refused = run_script("eval_perplexity.py", "--models", json.dumps([str(run)]), "--eval_dir", tmp_path / "eval2")
    _one_error(refused, "rebuilt since", "seed")
