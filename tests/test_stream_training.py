"""The streaming trainer (scripts/train_sparknet.py) as users run it: resume after SIGINT and kill -9 equal to an
uninterrupted run, two processes under torchrun, its TensorBoard tags, and mistakes in its input."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sparknet.train.folders import latest_complete_checkpoint
from tests.helpers import (
    OFFLINE_ENV,
    checkpoint_step,
    encoder_processes,
    finish_ok,
    kill_when,
    read_events,
    read_steps,
    run_script,
    split_in_two_files,
    start_script,
    stopped_checkpoint,
    stream_args,
    stream_of,
    train_streamed,
    wait_for,
    write_config,
    write_jsonl,
)


def _stream(args: list[str], processes: int = 1, own_group: bool = False) -> subprocess.Popen:
    return start_script("train_sparknet.py", args, processes=processes, own_group=own_group)


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_interrupted_twice_then_resumed_equals_an_uninterrupted_run(corpus_config: Path, tokenizer_dir: Path,
                                                                   tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The uninterrupted run is the streaming trainer in this process (as the script runs it): 100 steps on the
    60/40 mix, its hold-out of 16 validation blocks, the stream's own figures in TensorBoard, the realised mix in
    the metadata, and a model that loads. The same run killed (kill -9), resumed, stopped by SIGINT and resumed
    again by the script trains every step on the same blocks at the same LR, to the same weights."""
    from safetensors.torch import load_file
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForCausalLM

    settings = dict(target_tokens=100 * 4 * 128, eval_steps=10, save_steps=10, logging_steps=5,
                    record_batches=True)
    caplog.set_level("INFO")
    result = train_streamed(tmp_path / "a", corpus_config, tokenizer_dir, **settings)
    assert result.status == "finished" and result.metadata["steps"] == 100
    assert "holding out" in caplog.text
    events = read_events(tmp_path / "a" / "logs" / "run")
    capacity = "data/capacity_tokens_per_second"
    assert {"data/share/prose", "data/share/code", capacity, "train/loss", "eval/loss"} <= set(events)
    assert "data/hub_retries" not in events  # a local mix: no Hub read to retry (tests/test_hub_faults.py: a Hub one)
    assert all(v > 0 for _, v in events[capacity])
    acc = EventAccumulator(str(tmp_path / "a" / "logs" / "run"))
    acc.Reload()  # the figure says what it measures, where the user reads it
    assert "A capacity, not the training rate" in acc.SummaryMetadata(capacity).summary_description
    assert events["eval/loss"][-1][1] < events["eval/loss"][0][1]  # it learns
    stream = result.metadata["stream"]
    shares = stream["training"]["shares"]
    assert abs(shares["prose"] - 0.6) < 0.05 and abs(shares["code"] - 0.4) < 0.05
    assert stream["validation"]["blocks"] == 16 and result.metadata["tokens_seen"] == 100 * 4 * 128
    saved = {p.name for p in (result.run_dir / "checkpoint-100").iterdir()}
    assert {"stream_state.rank0.json", "model.safetensors"} <= saved
    AutoModelForCausalLM.from_pretrained(str(result.run_dir))

    args = stream_args(tmp_path / "b", corpus_config, tokenizer_dir, **settings)
    run_dir = tmp_path / "b" / "ckpt" / "run"
    kill_when(run_dir / "checkpoint-20" / ".complete", _stream(args))
    killed_at = latest_complete_checkpoint(run_dir)
    proc = _stream(args)
    wait_for(run_dir / f"checkpoint-{int(killed_at.name.split('-')[1]) + 20}" / ".complete", proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    assert f"resuming from {killed_at}" in out
    stopped_at = stopped_checkpoint(out, run_dir)  # the stop's own checkpoint, past the one waited for
    assert checkpoint_step(killed_at) + 20 < checkpoint_step(stopped_at) < 100
    out = finish_ok(_stream(args))
    assert f"resuming from {stopped_at}" in out
    # the closing eval is of the best checkpoint, and says so (not a second "step 100")
    best = json.loads((run_dir / "checkpoint-100" / "trainer_state.json").read_text())["best_model_checkpoint"]
    assert f"eval   final, best checkpoint ({Path(best).name})" in out and out.count("eval   step    100") == 1

    expected = read_steps(tmp_path / "a" / "ckpt" / "run" / "batches.jsonl")
    got = read_steps(run_dir / "batches.jsonl")
    assert sorted(got) == sorted(expected) == list(range(1, 101))
    for step in expected:
        assert got[step]["blocks"] == expected[step]["blocks"], step
        assert got[step]["lr"] == expected[step]["lr"], step
    a = load_file(str(tmp_path / "a" / "ckpt" / "run" / "model.safetensors"))
    b = load_file(str(run_dir / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


@pytest.mark.slow
def test_two_processes_train_one_model_on_disjoint_documents_and_resume_exactly(corpus_config: Path,
                                                                                tokenizer_dir: Path,
                                                                                tmp_path: Path) -> None:
    """Each source in two files: each process reads one file of each, every row once (no 1-in-N warning)."""
    from transformers import AutoModelForCausalLM

    config = split_in_two_files(corpus_config, tmp_path)
    settings = dict(target_tokens=60 * 2 * 4 * 128, global_batch_size=8, eval_steps=10, save_steps=10,
                    logging_steps=1000, record_batches=True, num_workers=1)
    out = finish_ok(_stream(stream_args(tmp_path / "a", config, tokenizer_dir, **settings), processes=2))
    assert "not a multiple of the 2 processes" not in out
    args = stream_args(tmp_path / "b", config, tokenizer_dir, **settings)
    run_dir = tmp_path / "b" / "ckpt" / "run"
    proc = _stream(args, processes=2)
    wait_for(run_dir / "checkpoint-10" / ".complete", proc)
    proc.send_signal(signal.SIGINT)  # to torchrun, which forwards it to both workers
    out, _ = proc.communicate(timeout=120)
    stopped = stopped_checkpoint(out, run_dir)
    assert 10 < checkpoint_step(stopped) < 60
    # on one process the per-process stream positions cannot continue: refused in one line, even with the flag,
    # and the refused attempt changes nothing on disk, so the original command still resumes
    folders = (run_dir, tmp_path / "b" / "logs" / "run")
    before = [_files(folder) for folder in folders]
    refused = subprocess.run([sys.executable, "scripts/train_sparknet.py", *args, "--allow_config_change", "true"],
                             env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "stream processes 2 -> 1" in refused.stderr and "--nproc_per_node" in refused.stderr, refused.stderr
    assert [_files(folder) for folder in folders] == before
    out = finish_ok(_stream(args, processes=2))
    assert f"resuming from {stopped}" in out

    reference_dir = tmp_path / "a" / "ckpt" / "run"
    for name in ("batches.jsonl", "batches.rank1.jsonl"):
        expected, got = read_steps(reference_dir / name), read_steps(run_dir / name)
        assert sorted(got) == sorted(expected) == list(range(1, 61))
        for step in expected:
            assert (got[step]["blocks"], got[step]["lr"], got[step]["weights"]) == (
                expected[step]["blocks"], expected[step]["lr"], expected[step]["weights"]), (name, step)
    rank0, rank1 = read_steps(run_dir / "batches.jsonl"), read_steps(run_dir / "batches.rank1.jsonl")
    assert all(rank0[s]["weights"] == rank1[s]["weights"] and rank0[s]["data_parallel"] for s in rank0)
    blocks0 = {b for s in rank0 for b in rank0[s]["blocks"]}
    blocks1 = {b for s in rank1 for b in rank1[s]["blocks"]}
    # disjoint documents (blocks named by a digest of their tokens)
    assert min(len(blocks0), len(blocks1)) > 230 and not blocks0 & blocks1
    saved = {p.name for p in (run_dir / "checkpoint-60").iterdir()}
    assert {"stream_state.rank0.json", "stream_state.rank1.json", "rng_state_0.pth", "rng_state_1.pth"} <= saved
    assert len(list((tmp_path / "a" / "logs" / "run").glob("events.out.tfevents.*"))) == 1
    AutoModelForCausalLM.from_pretrained(str(run_dir))


@pytest.mark.slow
def test_ctrl_c_to_the_whole_group_saves_and_a_killed_encoder_is_one_line(corpus_config: Path, tokenizer_dir: Path,
                                                                         tmp_path: Path) -> None:
    """Ctrl-C typed in a terminal reaches the encoder processes too: they ignore it, since the trainer still needs
    them to finish its step and save. An encoder killed from outside (the out-of-memory killer) stops the run with
    one line instead of a hang. The same command then resumes."""
    settings = dict(target_tokens=100 * 4 * 128, eval_steps=10, save_steps=10, logging_steps=5)
    args = stream_args(tmp_path, corpus_config, tokenizer_dir, **settings)
    run_dir = tmp_path / "ckpt" / "run"
    proc = _stream(args, own_group=True)
    wait_for(run_dir / "checkpoint-10" / ".complete", proc)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in out, out[-3000:]
    assert checkpoint_step(stopped_checkpoint(out, run_dir)) > 10

    proc = _stream(args)
    deadline = time.time() + 60
    while not (encoders := encoder_processes(proc.pid)) and time.time() < deadline:
        time.sleep(0.005)
    # as soon as it exists, while it starts: a death then used to block the main process for good
    os.kill(encoders[0], signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in out, out[-3000:]
    assert "error: an encoder process died: killed (SIGKILL)" in out and "run the same command again" in out

    # SIGTERM to the whole group (timeout, systemd, Slurm) is a clean stop too
    stopped = latest_complete_checkpoint(run_dir)
    proc = _stream(args, own_group=True)
    wait_for(run_dir / f"checkpoint-{int(stopped.name.split('-')[1]) // 10 * 10 + 10}" / ".complete", proc)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in out, out[-3000:]
    stopped = stopped_checkpoint(out, run_dir)

    # and so is SIGHUP (the terminal or SSH session closed)
    proc = _stream(args, own_group=True)
    wait_for(run_dir / f"checkpoint-{checkpoint_step(stopped) // 10 * 10 + 10}" / ".complete", proc)
    os.killpg(proc.pid, signal.SIGHUP)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 129 and "Traceback" not in out, out[-3000:]
    assert "received SIGHUP: saving a checkpoint" in out
    stopped = stopped_checkpoint(out, run_dir)
    out = finish_ok(_stream(args))
    assert f"resuming from {stopped}" in out


BAD_SOURCES = {  # what a source holds -> the one line it gets
    "no text column": ([{"id": 1, "score": 0.5}] * 5, "no usable text column (looked for text, content"),
    "not JSON": ("not json at all\n", "cannot read source 'bad' ("),
    "not an object": ('{"text": "a document"}\n' * 5 + "[1, 2]\n", "bad.jsonl): line 6 is [1, 2], not a JSON object: "
                      "a JSONL file holds one JSON object per line, with its text in 'text'"),
    "mixed values": ([{"text": "a document"}] * 5 + [{"text": 12345}],
                     "column 'text' holds mixed JSON values, not only text"),
}


def _bad_source(case: str, tmp_path: Path) -> Path:
    rows = BAD_SOURCES[case][0]
    data = tmp_path / "bad.jsonl"
    data.write_text(rows if isinstance(rows, str) else "".join(json.dumps(r) + "\n" for r in rows))
    return write_config(tmp_path / "mix.json", [{"name": "json", "data_files": str(data), "prob": 1.0}])


def test_a_bad_source_is_a_one_line_error_of_the_script(tokenizer_dir: Path, tmp_path: Path) -> None:
    """Through the script once; every case's one line, read by the stream, in the test below."""
    proc = run_script("train_sparknet.py", *stream_args(tmp_path, _bad_source("no text column", tmp_path),
                                                        tokenizer_dir))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert line and BAD_SOURCES["no text column"][1] in line[0], proc.stderr[-2000:]


@pytest.mark.parametrize("case", list(BAD_SOURCES))
def test_a_bad_source_read_by_the_stream_is_one_line(case: str, tokenizer_dir: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from sparknet.common.errors import UserError
    from sparknet.config.mix import load_config

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    stream = stream_of(load_config(_bad_source(case, tmp_path)), tok.to_str(), tok.token_to_id("<|endoftext|>"))
    try:
        with pytest.raises(UserError) as error:
            next(iter(stream))
    finally:
        stream.close()
    assert BAD_SOURCES[case][1] in str(error.value) and "\n" not in str(error.value), str(error.value)


@pytest.mark.slow
def test_a_mix_too_small_for_validation_and_training_is_an_error(tokenizer_dir: Path, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "tiny.jsonl", ["just a few words"] * 3)
    config = write_config(tmp_path / "mix.json", [{"name": "json", "data_files": str(data), "prob": 1.0}])
    proc = run_script("train_sparknet.py", *stream_args(tmp_path, config, tokenizer_dir, on_exhausted="stop"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "before one block of 128 tokens could be made" in error[0], proc.stderr[-3000:]


@pytest.mark.slow
def test_a_shuffle_buffer_larger_than_a_source_loses_none_of_it(tokenizer_dir: Path, tmp_path: Path) -> None:
    """The hold-out reads a source in its own order and training every row it did not use: a shuffle buffer larger
    than a small source (which skipped the rows left in the buffer, and left it nothing to train on) costs nothing;
    the run trains the source to its end."""
    texts = [f"document {i}: " + "some words of text " * 30 for i in range(200)]
    config = write_config(tmp_path / "mix.json", [{"name": "json", "data_files": str(write_jsonl(
        tmp_path / "small.jsonl", texts)), "prob": 1.0}])
    proc = run_script("train_sparknet.py", *stream_args(tmp_path, config, tokenizer_dir, shuffle_buffer=1000,
                                                        on_exhausted="stop", target_tokens=10**6))
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((tmp_path / "ckpt" / "run" / "training_metadata.json").read_text())
    held = meta["stream"]["validation"]["held_out"]["small"]
    training = meta["stream"]["training"]
    assert training["exhausted"] == ["small"]  # read to its end
    # every row the hold-out did not use whole is trained (the last partial block aside)
    assert training["documents"]["small"] >= 200 - held["rows"] + len(held["rests"]) - 2, (training, held)


@pytest.mark.slow
def test_a_small_source_the_hold_out_would_use_up_is_refused_at_the_start(tokenizer_dir: Path,
                                                                           tmp_path: Path) -> None:
    """Two local sources asked 0.3/0.7, the 0.7 one of 325 documents: with a validation split that takes most of
    it, the run would train on the other alone behind a warning. Now an error at the start names it; with a smaller
    VAL_TOKENS the same mix trains, and its realised mix is reported."""
    many = [f"short document {i}: " + "plain words here " * 20 for i in range(3000)]
    few = [f"long document {i}: " + "longer text with other words " * 60 for i in range(325)]
    config = write_config(tmp_path / "mix.json", [
        {"name": "json", "data_files": str(write_jsonl(tmp_path / "short.jsonl", many)), "prob": 0.3},
        {"name": "json", "data_files": str(write_jsonl(tmp_path / "long.jsonl", few)), "prob": 0.7}])
    # one eval and one save, at the end: a hold-out of 312 blocks evaluated every 4 steps cost more than training
    settings = dict(target_tokens=60 * 4 * 128, shuffle_buffer=8, eval_steps=60, save_steps=60)
    proc = run_script("train_sparknet.py", *stream_args(tmp_path / "a", config, tokenizer_dir, val_tokens=300_000,
                                                        **settings))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")][0]
    assert "source 'long' (325 rows)" in error and "VAL_TOKENS=300,000" in error, error
    assert not list((tmp_path / "a" / "ckpt" / "run").glob("checkpoint-*"))  # refused before training

    proc = run_script("train_sparknet.py", *stream_args(tmp_path / "b", config, tokenizer_dir, val_tokens=40_000,
                                                        **settings))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training mix (this process's stream):" in proc.stderr and "(asked 70.00%)" in proc.stderr
    meta = json.loads((tmp_path / "b" / "ckpt" / "run" / "training_metadata.json").read_text())
    training = meta["stream"]["training"]
    assert training["requested_shares"] == pytest.approx({"short": 0.3, "long": 0.7})
    assert training["shares"]["long"] == pytest.approx(0.7, abs=0.05)


def _damage(path: Path, how: str) -> None:
    """A file cut short (a full disk, a copy stopped half-way), overwritten with other bytes, or missing (a run begun
    before the file was kept)."""
    if how == "missing":
        path.unlink()
        return
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else b"\x00garbage\xff" * 8)


@pytest.mark.slow
def test_a_damaged_hold_out_file_is_refused_in_one_line_and_the_run_resumes_once_it_is_restored(
        corpus_config: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    """On resume, a damaged or lost val_blocks.npy, val_sources.npy or val_report.json is refused before any work,
    naming the file, as every other damaged run file is (it is the run's hold-out: never made again behind the
    user's back); the checkpoints stay, and with the file restored the same command resumes and finishes."""
    from sparknet.common.errors import UserError
    from sparknet.run_files import METADATA, RUN_CONFIG, VAL_BLOCKS, VAL_REPORT, VAL_SOURCES

    run_dir = tmp_path / "ckpt" / "run"
    settings = dict(target_tokens=8 * 4 * 128, save_steps=8, num_workers=0)
    assert train_streamed(tmp_path, corpus_config, tokenizer_dir, **settings).status == "finished"
    saved = {name: (run_dir / name).read_bytes() for name in (VAL_BLOCKS, VAL_REPORT, VAL_SOURCES)}
    (run_dir / METADATA).unlink()  # not finished: the run resumes from checkpoint-8 (its final export)
    checkpoints = sorted(p.name for p in run_dir.glob("checkpoint-*"))
    for name, how in ((VAL_REPORT, "truncated"), (VAL_BLOCKS, "garbage"), (VAL_BLOCKS, "truncated"),
                      (VAL_REPORT, "garbage"), (VAL_SOURCES, "truncated"), (VAL_SOURCES, "missing")):
        _damage(run_dir / name, how)
        said = "missing" if how == "missing" else ""
        with pytest.raises(UserError, match=f"{re.escape(str(run_dir / name))} is damaged \\({said}"):
            train_streamed(tmp_path, corpus_config, tokenizer_dir, **settings)
        assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == checkpoints, (name, how)
        (run_dir / name).write_bytes(saved[name])
    _damage(run_dir / VAL_REPORT, "garbage")  # through the script: one line, no traceback
    proc = run_script("train_sparknet.py", *stream_args(tmp_path, corpus_config, tokenizer_dir, **settings))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and f"{run_dir / VAL_REPORT} is damaged" in error[0] and "another RUN_NAME" in error[0], \
        proc.stderr[-3000:]
    (run_dir / VAL_REPORT).write_bytes(saved[VAL_REPORT])
    assert train_streamed(tmp_path, corpus_config, tokenizer_dir, **settings).status == "finished"
    assert {n: (run_dir / n).read_bytes() for n in saved} == saved

    # a finished run whose checkpoints were deleted (to save disk) keeps its hold-out: damage is refused, not remade
    import shutil

    for checkpoint in run_dir.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    _damage(run_dir / VAL_SOURCES, "truncated")
    with pytest.raises(UserError, match=f"{re.escape(str(run_dir / VAL_SOURCES))} is damaged"):
        train_streamed(tmp_path, corpus_config, tokenizer_dir, **settings)
    # a start stopped while it wrote the hold-out (no checkpoint yet): the next start holds out again and trains
    other = tmp_path / "b" / "ckpt" / "run"
    other.mkdir(parents=True)
    (other / RUN_CONFIG).write_bytes((run_dir / RUN_CONFIG).read_bytes())  # written first, then the hold-out
    (other / VAL_BLOCKS).write_bytes(saved[VAL_BLOCKS][:100])
    assert train_streamed(tmp_path / "b", corpus_config, tokenizer_dir, **settings).status == "finished"
    assert {n: (other / n).read_bytes() for n in saved} == saved


@pytest.mark.slow
def test_a_stopped_streamed_run_continued_with_more_steps_trains_each_block_of_the_stream_once(
        corpus_config: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    """A streamed run of 12 steps killed at step 11, inside its last window (the blocks 40-48 of windows of 20 blocks:
    cut short where the run ended), continued with MAX_STEPS 20 and ALLOW_CONFIG_CHANGE, as the packed trainer
    continues: the rest of that window is trained as it was shuffled, then the stream goes on, so the 20 steps
    trained exactly the stream's first 80 blocks, each once (those of an uninterrupted run of 20 steps)."""
    from collections import Counter

    settings = dict(global_batch_size=4, batch_size=4, eval_steps=11, save_steps=11, logging_steps=1000,
                    record_batches=True, num_workers=1, shuffle_window=20, target_tokens="None")
    reference = run_script("train_sparknet.py", *stream_args(tmp_path / "a", corpus_config, tokenizer_dir,
                                                             **settings, max_steps=20))
    assert reference.returncode == 0, reference.stderr[-3000:]
    run_dir = tmp_path / "b" / "ckpt" / "run"
    kill_when(run_dir / "checkpoint-11" / ".complete",
              _stream(stream_args(tmp_path / "b", corpus_config, tokenizer_dir, **settings, max_steps=12)))
    proc = run_script("train_sparknet.py", *stream_args(tmp_path / "b", corpus_config, tokenizer_dir, **settings,
                                                        max_steps=20, allow_config_change="true"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {run_dir / 'checkpoint-11'}" in proc.stderr
    expected, got = read_steps(tmp_path / "a" / "ckpt" / "run" / "batches.jsonl"), read_steps(run_dir / "batches.jsonl")
    assert sorted(got) == sorted(expected) == list(range(1, 21))
    for step in range(1, 11):  # the windows the end did not cut: as the uninterrupted run's
        assert got[step]["blocks"] == expected[step]["blocks"], step
    trained = Counter(block for record in got.values() for block in record["blocks"])
    assert trained == Counter(block for record in expected.values() for block in record["blocks"])
    assert json.loads((run_dir / "training_metadata.json").read_text())["steps"] == 20
