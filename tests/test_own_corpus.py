"""A user's own corpus of a few MB (the demo corpus's prose and code JSONL, a few hundred rows each, mixed 70/30),
run as a user runs it: the defaults that scale to small sources (VAL_TOKENS, the stream's SHUFFLE_BUFFER), a
model's context that follows the data's blocks, MAX_STEPS, and the whole chain with the scripts' defaults."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.helpers import (
    finish_ok,
    kill_when,
    read_steps,
    read_texts,
    run_script,
    start_script,
    stream_args,
    train_args,
    write_config,
    write_jsonl,
)


@pytest.fixture(scope="module")
def own_config(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two local JSONL sources 70/30, with the demo config's context (256), and a budget they hold (500k tokens:
    the prose, 2 MB, holds about 650k)."""
    mix = [{"name": "json", "prob": 0.7, "data_files": str(corpus_dir / "prose.train.jsonl")},
           {"name": "json", "prob": 0.3, "data_files": str(corpus_dir / "code.train.jsonl")}]
    return write_config(tmp_path_factory.mktemp("own") / "mine.json", mix, seed=42, context_length=256,
                        target_tokens=500_000)


def _without(args: list[str], *flags: str) -> list[str]:
    """`args` (flag value pairs) without the given flags: those constants keep the script's defaults."""
    out = []
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag.lstrip("-") not in flags:
            out += [flag, value]
    return out


def _source_bytes(corpus_dir: Path) -> int:
    return sum((corpus_dir / f"{name}.train.jsonl").stat().st_size for name in ("prose", "code"))


def _rows(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def test_the_default_val_tokens_follow_the_sources_and_the_configs_budget(own_config: Path, corpus_dir: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """VAL_TOKENS not set: 1 per 100 bytes of the sources, but never more than a tenth of the config's training
    budget (a validation split four times the training split made one evaluation cost more than the whole
    training), nor 2M; one line says both reasons. A build or run of fewer tokens than the config's gets the same
    split (every size of a dataset holds out the same blocks), and a warning that names VAL_TOKENS."""
    from sparknet.config.mix import load_config
    from sparknet.data.scaled_defaults import default_val_tokens

    config = load_config(own_config)
    by_size = math.ceil(_source_bytes(corpus_dir) / 100)
    assert 20_000 < by_size < 50_000  # the sources decide at the config's budget (500k: a tenth is 50k)
    small = load_config(write_config(own_config.parent / "small.json", json.loads(own_config.read_text())["mix"],
                                     seed=42, context_length=256, target_tokens=100_000))
    with caplog.at_level("INFO", logger="sparknet"):
        assert default_val_tokens(config) == by_size
        assert default_val_tokens(config, 10**9) == by_size  # a size asked decides nothing
        assert default_val_tokens(small) == 10_000  # the config's budget decides
        assert default_val_tokens(config, 10**9, most=5_000) == 5_000  # the cap decides
        assert default_val_tokens(config, 200_000) == by_size  # fewer tokens asked: the same split, and a warning
    lines = [r.getMessage() for r in caplog.records if "VAL_TOKENS" in r.getMessage()]
    assert lines[2] == (f"VAL_TOKENS: 10,000 validation tokens (1 per 100 bytes of the sources' "
                        f"{_source_bytes(corpus_dir):,} bytes would be {by_size:,}; a tenth of the config's 100,000 "
                        "training tokens would be 10,000; at most 2,000,000; set VAL_TOKENS to choose)"), lines
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and f"the {by_size:,} validation tokens are more than a tenth of the 200,000" in warned[0]
    assert "set VAL_TOKENS" in warned[0], warned
    hub = write_config(own_config.parent / "hub.json", [{"name": "someone/web", "prob": 1.0}], target_tokens=250_000)
    assert default_val_tokens(load_config(hub)) == 25_000  # a size not known: the config's budget still bounds it


@pytest.mark.slow
def test_a_build_with_the_default_val_tokens_fits_a_few_mb_and_holds_out_the_same_split_at_any_size(
        own_config: Path, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    """VAL_TOKENS not set: 1 validation token per 100 bytes of the sources (at most 2M and a tenth of the config's
    target_tokens), said in one line; the build that failed after the whole hold-out (2M tokens of 4 MB) gives a
    training split, and a smaller TARGET_TOKENS holds out the very same validation split (with a warning)."""
    out = tmp_path / "ds"
    proc = run_script("build_dataset_v5.py", "--config", own_config, "--tokenizer_dir", tokenizer_dir,
                      "--output_dir", out, "--num_workers", 0, "--target_tokens", 200_000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    chosen = math.ceil(_source_bytes(corpus_dir) / 100)
    assert chosen < 50_000  # the sources decide, not the config's budget (500k: a tenth is 50k)
    said = [line for line in proc.stderr.splitlines() if "VAL_TOKENS" in line]
    assert len(said) == 2 and f"{chosen:,} validation tokens (1 per 100 bytes" in said[0], proc.stderr[-3000:]
    assert "more than a tenth of the 200,000 training tokens asked here" in said[1], said
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"]["val_tokens"] == chosen
    assert manifest["splits"]["val"]["blocks"] == math.ceil(chosen / 256)
    assert manifest["splits"]["train"]["tokens"] == 200_000 // 256 * 256
    full = run_script("build_dataset_v5.py", "--config", own_config, "--tokenizer_dir", tokenizer_dir,
                      "--output_dir", tmp_path / "full", "--num_workers", 0)  # the config's 500k
    assert full.returncode == 0 and "more than a tenth" not in full.stderr, full.stderr[-3000:]
    for name in ("val.bin", "val_sources.bin"):
        assert (out / name).read_bytes() == (tmp_path / "full" / name).read_bytes(), name
    # a value set on the command line is kept, whatever the sources hold
    again = run_script("build_dataset_v5.py", "--config", own_config, "--tokenizer_dir", tokenizer_dir,
                       "--output_dir", tmp_path / "ds2", "--num_workers", 0, "--target_tokens", 20_000,
                       "--val_tokens", 3_000)
    assert again.returncode == 0 and "VAL_TOKENS" not in again.stderr, again.stderr[-3000:]
    assert json.loads((tmp_path / "ds2" / "manifest.json").read_text())["inputs"]["val_tokens"] == 3_000


@pytest.mark.slow
def test_a_stream_with_the_default_shuffle_buffer_starts_on_a_few_hundred_rows_and_resumes_exactly(
        own_config: Path, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    """SHUFFLE_BUFFER and VAL_TOKENS not set: the buffer is 5% of the smallest source's rows, the hold-out 1 token
    per 100 bytes (at most a tenth of the config's budget), each said in one line and recorded in the run's
    identity; the mix is 70/30 to within 2 points; killed after a checkpoint, the same command resumes to the same
    blocks, LR and weights."""
    rows = min(_rows(corpus_dir / "prose.train.jsonl"), _rows(corpus_dir / "code.train.jsonl"))
    # evaluated at the saves only: the default hold-out is ~330 blocks, an eval costs more than 8 steps of training
    settings = dict(block_size=128, target_tokens=48 * 4 * 128, eval_steps=16, save_steps=16, record_batches=True)
    # the config's budget (500k) bounds the hold-out, not the run's
    buffer, val = rows // 20, min(math.ceil(_source_bytes(corpus_dir) / 100), 500_000 // 10)
    args = _without(stream_args(tmp_path / "a", own_config, tokenizer_dir, **settings), "val_tokens",
                    "shuffle_buffer")
    out = finish_ok(start_script("train_sparknet.py", args))
    said = [line for line in out.splitlines() if "SHUFFLE_BUFFER" in line and "documents" in line]
    assert len(said) == 1 and f"SHUFFLE_BUFFER: {buffer} documents" in said[0], out[-3000:]
    assert f"VAL_TOKENS: {val:,} validation tokens" in out, out[-3000:]
    run_dir = tmp_path / "a" / "ckpt" / "run"
    identity = json.loads((run_dir / "run_config.json").read_text())
    assert (identity["shuffle_buffer"], identity["val_tokens"]) == (buffer, val)
    shares = json.loads((run_dir / "training_metadata.json").read_text())["stream"]["training"]["shares"]
    assert abs(shares["prose"] - 0.7) < 0.02 and abs(shares["code"] - 0.3) < 0.02, shares

    again = _without(stream_args(tmp_path / "b", own_config, tokenizer_dir, **settings), "val_tokens",
                     "shuffle_buffer")
    kill_when(tmp_path / "b" / "ckpt" / "run" / "checkpoint-16" / ".complete", start_script("train_sparknet.py", again))
    out = finish_ok(start_script("train_sparknet.py", again))
    assert "resuming from" in out
    expected, got = read_steps(run_dir / "batches.jsonl"), read_steps(tmp_path / "b" / "ckpt" / "run" / "batches.jsonl")
    assert sorted(got) == sorted(expected) == list(range(1, 49))
    for step in expected:
        assert (got[step]["blocks"], got[step]["lr"], got[step]["weights"]) == (
            expected[step]["blocks"], expected[step]["lr"], expected[step]["weights"]), step


@pytest.fixture(scope="module")
def dataset256(own_config: Path, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The own corpus's config (context 256) built small by the script: 256-token blocks."""
    dataset = tmp_path_factory.mktemp("ds256") / "ds"
    built = run_script("build_dataset_v5.py", "--config", own_config, "--tokenizer_dir", tokenizer_dir,
                       "--output_dir", dataset, "--num_workers", 0, "--target_tokens", 20_000, "--val_tokens", 2_000)
    assert built.returncode == 0, built.stderr[-3000:]
    return dataset


@pytest.mark.slow
def test_the_tiny_preset_trains_on_256_token_blocks_with_a_context_of_256(dataset256: Path, tmp_path: Path) -> None:
    """A model trained from scratch takes its context from the blocks: the preset gives width and depth."""
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, dataset256, target_tokens=8 * 4 * 256, eval_steps=4,
                                                          save_steps=8, sample_steps=0))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "run"
    assert json.loads((run_dir / "config.json").read_text())["n_positions"] == 256
    meta = json.loads((run_dir / "training_metadata.json").read_text())
    assert meta["model"]["n_positions"] == 256 and "context 256" in proc.stderr


@pytest.mark.slow
def test_the_llama_tiny_preset_streams_256_token_blocks_with_a_context_of_256(own_config: Path, tokenizer_dir: Path,
                                                                              tmp_path: Path) -> None:
    args = _without(stream_args(tmp_path, own_config, tokenizer_dir, model_preset="sparknet-llama-tiny",
                                max_steps=4, eval_steps=4, save_steps=4), "target_tokens")
    proc = run_script("train_sparknet.py", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = json.loads((tmp_path / "ckpt" / "run" / "config.json").read_text())
    assert config["max_position_embeddings"] == 256


@pytest.mark.slow
def test_a_resumed_run_keeps_its_models_context_and_refuses_longer_blocks_in_one_line(
        finished, dataset256: Path, tmp_path: Path) -> None:
    """The run's model (context 128, from its 128-token blocks) cannot take 256-token blocks, even with
    ALLOW_CONFIG_CHANGE: refused before any training, naming both and the fix."""
    import shutil

    _, tmp = finished
    shutil.copytree(tmp / "ckpt", tmp_path / "ckpt")
    (tmp_path / "ckpt" / "run" / "training_metadata.json").unlink()  # as if killed before the export
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, dataset256, allow_config_change=True))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "context of 128 tokens" in error[0] and "256" in error[0], proc.stderr[-3000:]
    assert "new RUN_NAME" in error[0]


@pytest.mark.slow
def test_the_own_corpus_chain_runs_with_the_defaults(own_config: Path, tmp_path: Path) -> None:
    """Tokenizer, build, both trainers on a few MB of JSONL 70/30, each with its defaults but for the sizes a CPU
    test affords (a small vocabulary, the tiny preset, 100 steps of 16 blocks at the higher LR so small a model
    takes), and the models learned: their eval loss ends more than a nat below where it started, and the packed
    run's below the loss a model that knows only the token frequencies (of the training split) has on the
    validation split."""
    tokenizer = tmp_path / "tok"
    proc = run_script("train_tokenizer_v5.py", "--config", own_config, "--vocab_size", 2048, "--output_dir",
                      tokenizer)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dataset = tmp_path / "ds"
    proc = run_script("build_dataset_v5.py", "--config", own_config, "--tokenizer_dir", tokenizer, "--output_dir",
                      dataset)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shares = json.loads((dataset / "manifest.json").read_text())["splits"]["train"]["sources"]
    assert abs(shares["prose"]["share"] - 0.7) < 0.02, shares
    common = ["--model_preset", "sparknet-tiny", "--max_steps", 100, "--global_batch_size", 16, "--batch_size", 16,
              "--learning_rate", 6e-3, "--eval_steps", 100, "--save_steps", 100, "--checkpoints_dir",
              tmp_path / "ckpt", "--logs_dir", tmp_path / "logs"]
    proc = run_script("train_sparknet_v5.py", "--config", own_config, "--dataset_dir", dataset, "--run_name",
                      "packed", *common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_script("train_sparknet.py", "--config", own_config, "--tokenizer_dir", tokenizer, "--run_name",
                      "stream", *common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    unigram = _unigram_loss(dataset)  # about 6.5 nats per token at this vocabulary
    for run in ("packed", "stream"):
        meta = json.loads((tmp_path / "ckpt" / run / "training_metadata.json").read_text())
        assert meta["steps"] == 100 and meta["model"]["n_positions"] == 256, run
        state = json.loads((tmp_path / "ckpt" / run / "checkpoint-100" / "trainer_state.json").read_text())
        assert state["global_step"] == 100
        start, end = meta["metrics"]["eval_loss_start"], meta["metrics"]["eval_loss"]
        assert end < start - 1.0, (run, start, end)
    # a model that learned nothing past token counts is at or above the unigram loss; the packed run is well below it
    # (the stream against the build: tests/test_build_is_the_stream.py)
    packed = json.loads((tmp_path / "ckpt" / "packed" / "training_metadata.json").read_text())["metrics"]
    assert packed["eval_loss"] < unigram - 0.1, (packed["eval_loss"], unigram)
    # then evaluation, export and a plain transformers pipeline() on the export, as a user goes on
    models = [tmp_path / "ckpt" / "packed", tmp_path / "ckpt" / "stream"]
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(m) for m in models]),
                      "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "eval" / "packed" / "perplexity.json").is_file()
    export = tmp_path / "export"
    proc = run_script("export_model.py", "--model", models[0], "--output_dir", export, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr[-3000:]
    from transformers import pipeline

    generate = pipeline("text-generation", model=str(export))
    out = generate("The ", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    assert out.startswith("The ") and len(out) > len("The ")


def _unigram_loss(dataset: Path) -> float:
    """The validation split's loss (nats per token) under the training split's token frequencies (add-one
    smoothed): the loss of a model that learned nothing past token counts, on the tokens the runs are scored on (the
    validation split holds the starts of long documents, which a model finds harder than the average token)."""
    import numpy as np

    from sparknet.data.packed.dataset import PackedDataset

    train, val = PackedDataset(dataset, "train"), PackedDataset(dataset, "val")
    vocab = train.manifest["tokenizer"]["vocab_size"]
    counts = np.bincount(np.asarray(train.tokens).reshape(-1), minlength=vocab) + 1.0
    log_p = np.log(counts / counts.sum())
    return float(-log_p[np.asarray(val.tokens).reshape(-1)].mean())


@pytest.mark.slow
def test_max_steps_trains_exactly_that_many_steps_with_the_schedule_over_them(tiny_dataset: Path,
                                                                              tmp_path: Path) -> None:
    args = _without(train_args(tmp_path, tiny_dataset, max_steps=7, eval_steps=7, save_steps=7, sample_steps=0,
                               record_batches=True, warmup_ratio=0.0), "target_tokens")
    proc = run_script("train_sparknet_v5.py", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "run"
    meta = json.loads((run_dir / "training_metadata.json").read_text())
    assert meta["steps"] == 7 and meta["tokens_seen"] == 7 * 4 * 128
    assert json.loads((run_dir / "checkpoint-7" / "trainer_state.json").read_text())["global_step"] == 7
    steps = read_steps(run_dir / "batches.jsonl")
    assert sorted(steps) == list(range(1, 8))
    # cosine from the peak (3e-3) down to MIN_LR_RATIO (0.1) of it over the 7 steps: the LR of step s is the
    # schedule's at s - 1
    lrs = [steps[s]["lr"] for s in range(1, 8)]
    assert lrs[0] == pytest.approx(3e-3)
    assert lrs[-1] == pytest.approx(3e-4 + 0.5 * 2.7e-3 * (1 + math.cos(math.pi * 6 / 7)), rel=1e-4)
    assert re.search(r"budget: [\d,]+ tokens = 7 steps", proc.stderr), proc.stderr[-3000:]


@pytest.mark.parametrize("script", ["train_sparknet_v5.py", "train_sparknet.py"])
def test_max_steps_with_target_tokens_is_refused_in_one_line(script: str) -> None:
    proc = run_script(script, "--max_steps", 10, "--target_tokens", 100_000)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "MAX_STEPS=10" in proc.stderr and "TARGET_TOKENS" in proc.stderr, (
        proc.stderr)


@pytest.mark.slow
def test_a_source_that_runs_dry_in_the_stream_says_its_share(corpus_dir: Path, tokenizer_dir: Path,
                                                            tmp_path: Path) -> None:
    """ON_EXHAUSTED=renormalise: the warning gives the dry source's share of the tokens so far against the share
    asked, and the metadata the realised training mix."""
    code = write_jsonl(tmp_path / "code.jsonl",
                       [text[:400] for text in read_texts(corpus_dir / "code.train.jsonl")[:40]])
    config = write_config(tmp_path / "mix.json", [
        {"name": "json", "prob": 0.7, "data_files": str(corpus_dir / "prose.train.jsonl")},
        {"name": "json", "prob": 0.3, "data_files": str(code)}])
    proc = run_script("train_sparknet.py", *stream_args(tmp_path, config, tokenizer_dir, shuffle_buffer=0,
                                                        eval_steps=8, save_steps=40))
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = re.search(r"source 'code' ran dry after \d+ documents, ([\d.]+)% of the tokens so far \(asked 30\.0%\)",
                     proc.stderr)
    assert said, proc.stderr[-3000:]
    training = json.loads((tmp_path / "ckpt" / "run" / "training_metadata.json").read_text())["stream"]["training"]
    assert "code" in training["exhausted"] and training["shares"]["code"] < 0.3
