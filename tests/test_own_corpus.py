"""A user's own corpus of a few MB (the demo corpus's prose and code JSONL, mixed 70/30), run as a user runs it: a
model's context that follows the data's blocks, MAX_STEPS, and a source that runs dry in the stream."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.helpers import (
    read_steps,
    read_texts,
    run_script,
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


@pytest.mark.slow
def test_the_tiny_preset_trains_on_256_token_blocks_with_a_context_of_256(own_config: Path, tokenizer_dir: Path,
                                                                          tmp_path: Path) -> None:
    """A model trained from scratch takes its context from the blocks: the preset gives width and depth."""
    dataset = tmp_path / "ds"
    built = run_script("build_dataset_v5.py", "--config", own_config, "--tokenizer_dir", tokenizer_dir,
                       "--output_dir", dataset, "--num_workers", 0, "--target_tokens", 20_000, "--val_tokens", 2_000)
    assert built.returncode == 0, built.stderr[-3000:]
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, dataset, target_tokens=8 * 4 * 256, eval_steps=4,
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
        finished, own_config: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    """The run's model (context 128, from its 128-token blocks) cannot take 256-token blocks, even with
    ALLOW_CONFIG_CHANGE: refused before any training, naming both and the fix."""
    import shutil

    _, tmp = finished
    shutil.copytree(tmp / "ckpt", tmp_path / "ckpt")
    (tmp_path / "ckpt" / "run" / "training_metadata.json").unlink()  # as if killed before the export
    dataset = tmp_path / "ds256"
    built = run_script("build_dataset_v5.py", "--config", own_config, "--tokenizer_dir", tokenizer_dir,
                       "--output_dir", dataset, "--num_workers", 0, "--target_tokens", 20_000, "--val_tokens", 2_000)
    assert built.returncode == 0, built.stderr[-3000:]
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, dataset, allow_config_change=True))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "context of 128 tokens" in error[0] and "256" in error[0], proc.stderr[-3000:]
    assert "new RUN_NAME" in error[0]


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
