"""The global batch is the recipe: the same command on 1 or 2 processes (torchrun, CPU/gloo) trains the same
optimizer steps on the same blocks with the same LR, and a packed run stopped by SIGINT after an epoch boundary
resumes exactly on two processes (1 -> 2; 2 -> 1 is tests/test_phases.py's, across a phase boundary). Checked
against the per-step log of blocks and LR (RECORD_BATCHES) and the saved weights, not against the run's own
report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import (
    OFFLINE_ENV,
    checkpoint_step,
    finish_ok,
    kill_when,
    read_steps,
    start_script,
    step_blocks,
    stopped_checkpoint,
    stream_args,
    train_args,
    train_packed,
    train_settings,
    train_streamed,
    wait_for,
    weights_apart,
)

STEPS = 120  # 8 blocks of 128 tokens per step; the tiny dataset's 781 blocks make 97 steps an epoch
GLOBAL = 8
SETTINGS = dict(target_tokens=STEPS * GLOBAL * 128, global_batch_size=GLOBAL, batch_size=4, eval_steps=20,
                save_steps=20, sample_steps=0, logging_steps=1000, record_batches=True)


def _packed(args: list[str], processes: int) -> subprocess.Popen:
    return start_script("train_sparknet_v5.py", args, processes=processes)


def _stop_after(run_dir: Path, step: int, args: list[object], processes: int) -> Path:
    """Starts the run, sends SIGINT once checkpoint-`step` is complete, returns the checkpoint it saved."""
    proc = _packed(args, processes)
    wait_for(run_dir / f"checkpoint-{step}" / ".complete", proc, timeout=300)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    # torchrun itself ends with its SignalException (exit 1) once its workers have saved and stopped
    assert proc.returncode == (128 + signal.SIGINT if processes == 1 else 1), out[-3000:]
    saved = stopped_checkpoint(out, run_dir)
    assert step < checkpoint_step(saved) < STEPS
    return saved


def _eval_loss(run_dir: Path) -> float:
    return json.loads((run_dir / "training_metadata.json").read_text())["metrics"]["eval_loss"]


@pytest.fixture(scope="module")
def runs(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("count")
    out: dict[str, Path] = {}
    for name, processes in (("one", 1), ("two", 2)):
        log = finish_ok(_packed(train_args(tmp / name, tiny_dataset, **SETTINGS), processes))
        assert (f"global batch {GLOBAL} blocks of 128 tokens = micro-batch 4 x accum {2 // processes} x "
                f"{processes} device(s)") in log, log[-3000:]
        out[name] = tmp / name / "ckpt" / "run"
    # 1 -> 2: stopped after the epoch boundary (step 97), resumed on two processes
    args = train_args(tmp / "1to2", tiny_dataset, **SETTINGS)
    out["1to2_stop"] = _stop_after(tmp / "1to2" / "ckpt" / "run", 100, args, 1)
    log = finish_ok(_packed(args, 2))
    assert f"resuming from {out['1to2_stop']}" in log and "changed settings" not in log, log[-3000:]
    out["1to2"] = tmp / "1to2" / "ckpt" / "run"
    return out


@pytest.mark.slow
def test_one_and_two_processes_train_the_same_blocks_with_the_same_lr(runs: dict[str, Path]) -> None:
    one, two = step_blocks(runs["one"]), step_blocks(runs["two"])
    assert sorted(one) == sorted(two) == list(range(1, STEPS + 1))
    assert one == two
    epoch = [b for s in range(1, 98) for b in one[s][0]]
    assert len(epoch) == len(set(epoch)) == 97 * GLOBAL  # an epoch: whole global batches of distinct blocks
    assert set(one[98][0]) != set(one[1][0])  # the next epoch is another permutation
    assert weights_apart(runs["two"] / f"checkpoint-{STEPS}", runs["one"] / f"checkpoint-{STEPS}") < 1e-2
    assert abs(_eval_loss(runs["two"]) - _eval_loss(runs["one"])) < 1e-3
    for name in ("one", "two"):
        meta = json.loads((runs[name] / "training_metadata.json").read_text())
        assert meta["steps"] == STEPS and meta["tokens_seen"] == STEPS * GLOBAL * 128


@pytest.mark.slow
def test_a_run_resumed_on_another_process_count_continues_exactly(runs: dict[str, Path]) -> None:
    name = "1to2"
    reference = step_blocks(runs["one"])
    resumed = step_blocks(runs[name])
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert resumed == reference  # before and after the stop: the same blocks in every step, the same LR
    assert weights_apart(runs[name] / f"checkpoint-{STEPS}", runs["one"] / f"checkpoint-{STEPS}") < 1e-2
    assert abs(_eval_loss(runs[name]) - _eval_loss(runs["one"])) < 1e-3
    meta = json.loads((runs[name] / "training_metadata.json").read_text())
    assert meta["steps"] == STEPS and meta["tokens_seen"] == STEPS * GLOBAL * 128
    assert meta["world_size"] == 2


@pytest.mark.slow
def test_allow_config_change_keeps_tokens_seen_true(tiny_dataset: Path, tmp_path: Path) -> None:
    """A run killed at step 8 of 4-block steps, continued with GLOBAL_BATCH_SIZE=8 under ALLOW_CONFIG_CHANGE:
    tokens_seen is what the steps trained (counted from the per-step block log), not steps x today's step size."""

    settings = dict(target_tokens=40 * 4 * 128, global_batch_size=4, eval_steps=4, save_steps=8, sample_steps=0,
                    record_batches=True)
    run_dir = tmp_path / "ckpt" / "run"
    kill_when(run_dir / "checkpoint-8" / ".complete",
              start_script("train_sparknet_v5.py", train_args(tmp_path, tiny_dataset, **settings)))
    result = train_packed(train_settings(tmp_path, **{**settings, "global_batch_size": 8, "allow_config_change": True}),
                          tiny_dataset)
    assert result.status == "finished"
    steps = read_steps(run_dir / "batches.jsonl")
    assert sorted(steps) == list(range(1, 21)) and len(steps[8]["blocks"]) == 4 and len(steps[9]["blocks"]) == 8
    trained = sum(len(record["blocks"]) for record in steps.values()) * 128
    assert result.metadata["tokens_seen"] == trained == (8 * 4 + 12 * 8) * 128


def test_a_global_batch_that_does_not_split_is_one_line(tiny_dataset: Path, tmp_path: Path) -> None:
    from sparknet.common.errors import UserError
    from sparknet.train.batch import plan_batch

    # the trainer as the script runs it (a UserError is the script's one line: tests/test_training.py)
    with pytest.raises(UserError) as caught:
        train_packed(train_settings(tmp_path, global_batch_size=8, batch_size=3), tiny_dataset)
    assert "BATCH_SIZE=3 does not divide a device's share of the global batch" in str(caught.value)
    assert "e.g. 2" in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "ckpt" / "run").exists()
    with pytest.raises(UserError, match="do not split evenly over 3 devices: use a multiple of 3 \\(e.g. 126 or 129"):
        plan_batch(128, 32, 3)
    # a micro-batch larger than a device's share: the share, said so
    plan = plan_batch(128, 32, 8)
    assert (plan.micro, plan.accum) == (16, 1) and "micro-batches of 16" in plan.note
    assert [(p.micro, p.accum) for p in (plan_batch(128, 32, d) for d in (1, 2, 4))] == [(32, 4), (32, 2), (32, 1)]


def test_fewer_training_blocks_than_one_global_batch_is_refused_before_the_run(tiny_dataset: Path,
                                                                              tmp_path: Path) -> None:
    from sparknet.common.errors import UserError
    from sparknet.data import PackedDataset
    from sparknet.train.batch import GlobalBatchSampler

    blocks = len(PackedDataset(tiny_dataset, "train"))
    with pytest.raises(UserError, match=f"the dataset has {blocks} training blocks, fewer than one global batch "
                                        f"\\(GLOBAL_BATCH_SIZE={2 * blocks}\\)"):
        train_packed(train_settings(tmp_path, global_batch_size=2 * blocks, batch_size=2,
                                    target_tokens=4 * blocks * 128), tiny_dataset)
    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(UserError, match="fewer than one global batch"):
        GlobalBatchSampler(blocks, blocks + 1, seed=0)
    assert len(GlobalBatchSampler(blocks, blocks, seed=0)) == blocks


def test_a_run_folder_in_another_format_is_refused_in_one_line_and_left_as_it_is(tmp_path: Path) -> None:
    """A run folder records its format; one from before (no version: format 1, when the recipe was BATCH_SIZE x
    GRAD_ACCUM x devices) is refused naming both versions, never migrated; a fixed key is still checked."""
    from sparknet.common.errors import UserError
    from sparknet.run_files import RUN_CONFIG
    from sparknet.train.folders import RUN_FORMAT, open_run

    run_dir = tmp_path / "ckpt" / "run"
    today = {"model_preset": "sparknet-tiny", "global_batch_size": 16, "data": "stream"}
    why = "resumes only on the same number of processes"
    open_run("run", str(tmp_path / "ckpt"), str(tmp_path / "logs"), today, False, True,
             fixed={"stream_processes": (2, why)})
    written = json.loads((run_dir / RUN_CONFIG).read_text())
    assert written == {"format_version": RUN_FORMAT, **today, "stream_processes": 2}
    with pytest.raises(UserError, match=f"stream processes 2 -> 1: {why}"):
        open_run("run", str(tmp_path / "ckpt"), str(tmp_path / "logs"), today, True, True,
                 fixed={"stream_processes": (1, why)})
    old = {"model_preset": "sparknet-tiny", "batch_size": 4, "grad_accum": 2, "world_size": 2, "data": "stream"}
    (run_dir / RUN_CONFIG).write_text(json.dumps(old))
    with pytest.raises(UserError, match=f"run run is in run folder format 1, and this SparkNet reads format "
                                        f"{RUN_FORMAT}: start it again under another RUN_NAME"):
        open_run("run", str(tmp_path / "ckpt"), str(tmp_path / "logs"), today, True, True,
                 fixed={"stream_processes": (2, why)})
    assert json.loads((run_dir / RUN_CONFIG).read_text()) == old  # the refused attempt wrote nothing


def test_a_run_recorded_with_a_setting_since_removed_is_refused_by_its_format(tmp_path: Path) -> None:
    """A run folder of the format before DOCUMENT_MASKING left the settings is refused in one line naming both
    formats, whether the setting was on or off: SparkNet keeps no shim that reads old folders."""
    from sparknet.common.errors import UserError
    from sparknet.run_files import RUN_CONFIG
    from sparknet.train.folders import RUN_FORMAT, open_run

    run_dir = tmp_path / "ckpt" / "run"
    run_dir.mkdir(parents=True)
    today = {"model_preset": "sparknet-tiny", "global_batch_size": 16, "data": "packed"}
    for masking in (False, True):
        old = {"format_version": RUN_FORMAT - 1, **today, "document_masking": masking}
        (run_dir / RUN_CONFIG).write_text(json.dumps(old))
        with pytest.raises(UserError, match=f"run run is in run folder format {RUN_FORMAT - 1}, and this SparkNet "
                                            f"reads format {RUN_FORMAT}: start it again under another RUN_NAME"):
            open_run("run", str(tmp_path / "ckpt"), str(tmp_path / "logs"), today, False, True)
        assert json.loads((run_dir / RUN_CONFIG).read_text()) == old
    (run_dir / RUN_CONFIG).write_text(json.dumps({"format_version": RUN_FORMAT, **today}))
    assert open_run("run", str(tmp_path / "ckpt"), str(tmp_path / "logs"), today, False, True).resume is None


def test_a_stream_run_folder_in_another_format_is_refused_before_its_hold_out(corpus_config: Path,
                                                                             tokenizer_dir: Path,
                                                                             tmp_path: Path) -> None:
    """The streaming trainer reads its run folder (the saved hold-out) before the Trainer opens it: the format is
    checked first, so an old folder is the same one line, not a KeyError on what that format lacked."""
    import numpy as np

    from sparknet.common.errors import UserError
    from sparknet.run_files import RUN_CONFIG, VAL_BLOCKS, VAL_REPORT

    run_dir = tmp_path / "ckpt" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / RUN_CONFIG).write_text(json.dumps({"data": "stream", "batch_size": 4, "grad_accum": 1}))
    (run_dir / VAL_REPORT).write_text(json.dumps({"rows_held_out": {}}))  # before commits were recorded
    np.save(run_dir / VAL_BLOCKS, np.zeros((2, 128), dtype=np.int64))
    from sparknet.train.folders import RUN_FORMAT

    with pytest.raises(UserError, match=f"run run is in run folder format 1, and this SparkNet reads format "
                                        f"{RUN_FORMAT}"):
        train_streamed(tmp_path, corpus_config, tokenizer_dir)


@pytest.mark.slow
def test_two_launchers_over_loopback_train_data_parallel_with_a_nodes_cores_each(corpus_config: Path,
                                                                                 tokenizer_dir: Path,
                                                                                 tmp_path: Path) -> None:
    """Two torchrun launchers of one process each, rendezvous on 127.0.0.1 (a stand-in for two nodes): one model
    trained data-parallel by the streaming trainer, and each process encodes on all of its node's cores (cores /
    LOCAL_WORLD_SIZE), not on cores / WORLD_SIZE."""
    import socket

    from sparknet.common.runtime import available_cores

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = stream_args(tmp_path, corpus_config, tokenizer_dir, target_tokens=10 * 8 * 128, global_batch_size=8,
                 eval_steps=5, save_steps=5, logging_steps=5, record_batches=True)
    at = args.index("--num_workers")
    del args[at:at + 2]  # the default: the node's cores over its processes
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
         "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
         "scripts/train_sparknet.py", *args], env={**os.environ, **OFFLINE_ENV}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    logs = [finish_ok(proc, timeout=300) for proc in launchers]
    # (the main process logs; the other node's, started the same way, counts the same)
    assert f"stream: {available_cores()} encoding process(es) for this training process" in logs[0], logs[0][-3000:]
    run_dir = tmp_path / "ckpt" / "run"
    rank0, rank1 = read_steps(run_dir / "batches.jsonl"), read_steps(run_dir / "batches.rank1.jsonl")
    assert sorted(rank0) == sorted(rank1) == list(range(1, 11))
    assert all(rank0[s]["data_parallel"] and rank0[s]["weights"] == rank1[s]["weights"] for s in rank0)
    assert not {b for r in rank0.values() for b in r["blocks"]} & {b for r in rank1.values() for b in r["blocks"]}
