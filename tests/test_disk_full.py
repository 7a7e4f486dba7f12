"""A full disk is one line (where, and what to do), not a traceback, for the build, a checkpoint save, the final
export and TensorBoard's writes; the saved work stays resumable. The disk is a small tmpfs the test mounts (skipped
where mounting is not allowed)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from sparknet.train.folders import latest_complete_checkpoint
from tests.helpers import build_args, run_script, train_args

pytestmark = pytest.mark.slow  # end-to-end scenarios: the full tier (make test-all)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[callable]:
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
        folder.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip()})")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], capture_output=True)


def test_a_build_on_a_full_disk_is_one_line(corpus_config: Path, tokenizer_dir: Path, small_disk) -> None:
    disk = small_disk("150k")
    proc = run_script("build_dataset_v5.py", *build_args(corpus_config, disk / "ds", tokenizer_dir),
                      "--target_tokens", 200_000)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"error: no space left on the device writing {disk}" in proc.stderr, proc.stderr[-3000:]
    assert "free space, then run the same command again" in proc.stderr


def test_a_checkpoint_save_on_a_full_disk_is_one_line_and_resumes(tiny_dataset: Path, tmp_path: Path,
                                                                   small_disk) -> None:
    disk = small_disk("3m")
    args = train_args(tmp_path, tiny_dataset, checkpoints_dir=str(disk / "ckpt"), target_tokens=40 * 4 * 128,
                       eval_steps=4, save_steps=4, sample_steps=0, save_total_limit=10)
    proc = run_script("train_sparknet_v5.py", *args)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "error: no space left on the device writing" in proc.stderr and str(disk) in proc.stderr
    # space freed (the run moved to a larger disk): the same command goes on from the last complete checkpoint
    import shutil

    shutil.copytree(disk / "ckpt", tmp_path / "ckpt")
    saved = latest_complete_checkpoint(tmp_path / "ckpt" / "run")
    args = train_args(tmp_path, tiny_dataset, target_tokens=40 * 4 * 128, eval_steps=4, save_steps=4,
                       sample_steps=0, save_total_limit=10)
    proc = run_script("train_sparknet_v5.py", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert saved is not None and f"resuming from {tmp_path / 'ckpt' / 'run' / saved.name}" in proc.stderr


def test_the_final_export_on_a_full_disk_is_one_line_and_the_same_command_completes_it(
        tiny_dataset: Path, tmp_path: Path, small_disk) -> None:
    # room for the one checkpoint (2.2 MB at step 40) but not for the exported weights beside it
    disk = small_disk("2600k")
    kw = dict(target_tokens=40 * 4 * 128, eval_steps=4, save_steps=40, sample_steps=0, save_total_limit=1)
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, tiny_dataset, checkpoints_dir=str(disk / "ckpt"),
                                                           **kw))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"error: no space left on the device writing {disk / 'ckpt'}" in proc.stderr, proc.stderr[-3000:]
    assert not (disk / "ckpt" / "run" / "training_metadata.json").exists()
    import shutil

    shutil.copytree(disk / "ckpt", tmp_path / "ckpt")
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, tiny_dataset, **kw))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "checkpoint-40 is the run's last step: going straight to the final eval and export" in proc.stderr
    metadata = json.loads((tmp_path / "ckpt" / "run" / "training_metadata.json").read_text())
    assert metadata["steps"] == 40
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "run")
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "ckpt" / "run" / "checkpoint-40" / "model.safetensors")
    weights = exported.state_dict()
    assert saved and set(saved) <= set(weights)  # (the tied output layer is saved once, as the embedding)
    for name, tensor in saved.items():
        assert torch.equal(weights[name], tensor), name


def test_tensorboard_on_a_full_disk_is_one_line_and_the_run_resumes(tiny_dataset: Path, tmp_path: Path,
                                                                    small_disk) -> None:
    disk = small_disk("12k")  # the run's event file grows to about 16 kB
    kw = dict(target_tokens=40 * 4 * 128, eval_steps=4, save_steps=8, sample_steps=0, save_total_limit=10)
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, tiny_dataset, logs_dir=str(disk / "logs"), **kw))
    # the event writer's thread dies first: its traceback stays out, the main thread's one line says it all
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"error: no space left on the device writing {disk / 'logs'}" in proc.stderr, proc.stderr[-3000:]
    stopped = latest_complete_checkpoint(tmp_path / "ckpt" / "run")
    proc = run_script("train_sparknet_v5.py", *train_args(tmp_path, tiny_dataset, **kw))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert stopped is not None and f"resuming from {tmp_path / 'ckpt' / 'run' / stopped.name}" in proc.stderr
    assert json.loads((tmp_path / "ckpt" / "run" / "training_metadata.json").read_text())["steps"] == 40
