"""A full disk is one line (where, and what to do), not a traceback, for the build and for a checkpoint save; the
saved work stays resumable. The disk is a small tmpfs the test mounts (skipped where mounting is not allowed)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_script
from tests.test_packed_dataset import _script_args as _build_args
from tests.test_training import _script_args as _train_args


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


def test_a_build_on_a_full_disk_is_one_line(corpus_config: Path, tokenizer_dir: Path, small_disk) -> None:  # noqa: ANN001
    disk = small_disk("150k")
    proc = run_script("build_dataset_v5.py", *_build_args(corpus_config, disk / "ds", tokenizer_dir),
                      "--target_tokens", 200_000)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"error: no space left on the device writing {disk}" in proc.stderr, proc.stderr[-3000:]
    assert "free space, then run the same command again" in proc.stderr


def test_a_checkpoint_save_on_a_full_disk_is_one_line_and_resumes(tiny_dataset: Path, tmp_path: Path,
                                                                   small_disk) -> None:  # noqa: ANN001
    disk = small_disk("3m")
    args = _train_args(tmp_path, tiny_dataset, checkpoints_dir=str(disk / "ckpt"), target_tokens=40 * 4 * 128,
                       eval_steps=4, save_steps=4, sample_steps=0, save_total_limit=10)
    proc = run_script("train_sparknet_v5.py", *args)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "error: no space left on the device writing" in proc.stderr and str(disk) in proc.stderr
    # space freed (the run moved to a larger disk): the same command goes on from the last complete checkpoint
    import shutil

    from sparknet.train.run_folder import latest_complete_checkpoint

    shutil.copytree(disk / "ckpt", tmp_path / "ckpt")
    saved = latest_complete_checkpoint(tmp_path / "ckpt" / "run")
    args = _train_args(tmp_path, tiny_dataset, target_tokens=40 * 4 * 128, eval_steps=4, save_steps=4,
                       sample_steps=0, save_total_limit=10)
    proc = run_script("train_sparknet_v5.py", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert saved is None or f"resuming from {tmp_path / 'ckpt' / 'run' / saved.name}" in proc.stderr
