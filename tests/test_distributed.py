"""Two processes under torchrun (CPU, gloo): really data-parallel, fresh and resumed, and a Ctrl-C that stops in time.

Each rank logs, per optimizer step, its LR, a digest of each of its blocks and a hash of the weights the step
starts from (RECORD_BATCHES); equal hashes across ranks are the independent evidence that gradients are averaged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparknet.train.folders import COMPLETE_MARKER
from tests.helpers import (
    OFFLINE_ENV,
    checkpoint_step,
    finish,
    read_events,
    read_steps,
    start_script,
    stopped_checkpoint,
    stream_args,
    train_args,
    wait_for,
)

pytestmark = pytest.mark.slow  # end-to-end scenarios: the full tier (make test-all)

STEPS = 120  # 2 ranks x 4 blocks of 128 tokens per step


@pytest.fixture(scope="module")
def runs(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An uninterrupted 2-process run, and one stopped by SIGINT to torchrun then resumed."""
    tmp = tmp_path_factory.mktemp("ddp")
    settings = dict(target_tokens=STEPS * 2 * 4 * 128, global_batch_size=8, eval_steps=40, save_steps=40,
                    sample_steps=0, logging_steps=1000, record_batches=True)
    reference = start_script("train_sparknet_v5.py", train_args(tmp / "a", tiny_dataset, **settings), processes=2)
    out = finish(reference)
    assert reference.returncode == 0, out[-3000:]

    args = train_args(tmp / "b", tiny_dataset, **settings)
    run_dir = tmp / "b" / "ckpt" / "run"
    proc = start_script("train_sparknet_v5.py", args, processes=2)
    wait_for(run_dir / "eval_start.json", proc)
    time.sleep(0.5)
    sent = time.time()
    proc.send_signal(signal.SIGINT)  # torchrun forwards it to both workers
    out = finish(proc, timeout=60)
    stopped_after = time.time() - sent
    # both workers stop in one line each; torchrun's own SignalException traceback may only come after them
    assert out.count("stopped at step") == 2, out[-3000:]
    assert "Traceback" not in out[:out.rindex("stopped at step")], out[-3000:]
    saved = stopped_checkpoint(out, run_dir)
    # the stop's own checkpoint, within a couple of steps: long before the next logging (1000) or save (40) step
    assert checkpoint_step(saved) % 40 != 0, saved
    assert stopped_after < 25, stopped_after

    resumed = start_script("train_sparknet_v5.py", args, processes=2)
    out = finish(resumed)
    assert resumed.returncode == 0, out[-3000:]
    assert f"resuming from {saved}" in out
    return {"reference": tmp / "a", "resumed": tmp / "b", "stop": Path(saved)}


def test_ranks_hold_equal_weights_and_train_on_disjoint_blocks(runs: dict[str, Path]) -> None:
    for name in ("reference", "resumed"):
        run_dir = runs[name] / "ckpt" / "run"
        rank0, rank1 = read_steps(run_dir / "batches.jsonl"), read_steps(run_dir / "batches.rank1.jsonl")
        assert sorted(rank0) == sorted(rank1) == list(range(1, STEPS + 1)), name
        for step in rank0:
            assert rank0[step]["data_parallel"] and rank1[step]["data_parallel"], (name, step)
            assert rank0[step]["weights"] == rank1[step]["weights"], (name, step)
            assert rank0[step]["lr"] == rank1[step]["lr"]
        # within the first pass over the 781 training blocks, no block is trained on by both ranks
        first_pass = range(1, 781 // 8 + 1)
        blocks0 = {b for s in first_pass for b in rank0[s]["blocks"]}
        blocks1 = {b for s in first_pass for b in rank1[s]["blocks"]}
        assert len(blocks0) > 300 and not blocks0 & blocks1, name
    assert rank0[1]["weights"] != rank0[STEPS]["weights"]  # it trained


def test_resumed_run_repeats_the_uninterrupted_one(runs: dict[str, Path]) -> None:
    for log in ("batches.jsonl", "batches.rank1.jsonl"):
        expected = read_steps(runs["reference"] / "ckpt" / "run" / log)
        got = read_steps(runs["resumed"] / "ckpt" / "run" / log)
        for step in expected:
            assert got[step]["lr"] == expected[step]["lr"], step
            assert got[step]["blocks"] == expected[step]["blocks"], step
            assert got[step]["weights"] == expected[step]["weights"], step


def test_checkpoints_list_every_ranks_files(runs: dict[str, Path]) -> None:
    run_dir = runs["resumed"] / "ckpt" / "run"
    checkpoints = sorted(run_dir.glob("checkpoint-*"))
    assert checkpoints
    for folder in checkpoints:
        marker = json.loads((folder / COMPLETE_MARKER).read_text())
        assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt"} <= set(marker["files"])


def test_one_event_stream_with_every_step_and_a_loadable_model(runs: dict[str, Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    stop = int(runs["stop"].name.split("-")[1])
    for name in ("reference", "resumed"):
        log_dir = runs[name] / "logs" / "run"
        assert len(list(log_dir.glob("events.out.tfevents.*"))) == (1 if name == "reference" else 2)  # one a process
        events = read_events(log_dir)
        assert [s for s, _ in events["train/grad_norm"]] == list(range(1, STEPS + 1)), name
        logged = [s for s, _ in events["train/loss"]]
        assert logged == ([STEPS] if name == "reference" else [stop, STEPS]), logged  # last step and the stop
        run_dir = runs[name] / "ckpt" / "run"
        meta = json.loads((run_dir / "training_metadata.json").read_text())
        assert meta["world_size"] == 2 and meta["tokens_seen"] == STEPS * 2 * 4 * 128
        # the closing eval of the best checkpoint is the in-loop eval of that step
        best_step = int(Path(meta["metrics"]["best_checkpoint"]).name.split("-")[1])
        in_loop = dict(events["eval/loss"])[best_step]
        assert abs(meta["metrics"]["eval_loss"] - in_loop) < 1e-5, (meta["metrics"]["eval_loss"], in_loop)
        model = AutoModelForCausalLM.from_pretrained(str(run_dir))
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


@pytest.mark.parametrize("trainer", ["train_sparknet_v5.py", "train_sparknet.py"])
def test_accelerate_launch_trains_both_trainers_data_parallel(trainer: str, tiny_dataset: Path, corpus_config: Path,
                                                              tokenizer_dir: Path, tmp_path: Path) -> None:
    """`accelerate launch --multi_gpu --num_processes 2` (gloo on CPU) runs either trainer unchanged: every step
    DDP-wrapped with equal weights on both ranks, disjoint blocks, one event file, a model that loads."""
    from transformers import AutoModelForCausalLM


    settings = dict(target_tokens=20 * 2 * 4 * 128, global_batch_size=8, eval_steps=10, save_steps=10,
                    sample_steps=0, logging_steps=5, record_batches=True)
    if trainer == "train_sparknet.py":
        args = stream_args(tmp_path, corpus_config, tokenizer_dir, **settings)
    else:
        args = train_args(tmp_path, tiny_dataset, **settings)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", f"scripts/{trainer}",
               *map(str, args)]
    proc = subprocess.run(command, env={**os.environ, **OFFLINE_ENV}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    run_dir = tmp_path / "ckpt" / "run"
    rank0, rank1 = read_steps(run_dir / "batches.jsonl"), read_steps(run_dir / "batches.rank1.jsonl")
    assert sorted(rank0) == sorted(rank1) == list(range(1, 21))
    for step in rank0:
        assert rank0[step]["data_parallel"] and rank1[step]["data_parallel"], step
        assert rank0[step]["weights"] == rank1[step]["weights"], step
    blocks0 = {b for s in rank0 for b in rank0[s]["blocks"]}
    blocks1 = {b for s in rank1 for b in rank1[s]["blocks"]}
    assert len(blocks0) == len(blocks1) == 80 and not blocks0 & blocks1
    assert len(list((tmp_path / "logs" / "run").glob("events.out.tfevents.*"))) == 1
    assert rank0[1]["weights"] != rank0[20]["weights"]
    AutoModelForCausalLM.from_pretrained(str(run_dir))
