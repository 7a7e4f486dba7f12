"""The demo as a user runs it: `make demo`, Ctrl-C in the middle of training (a SIGINT to the terminal's whole
foreground group: make, the demo, the script it runs), then the same command again, which resumes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from sparknet.demo.chain import demo_state
from sparknet.runtime import PROJECT_ROOT
from sparknet.train.run_folder import is_complete, latest_complete_checkpoint
from tests.conftest import OFFLINE_ENV


@pytest.fixture
def demo_run(tmp_path: Path):  # noqa: ANN201 - yields (run name, DEMO_ARGS)
    """DEMO_ARGS for a short demo whose tokenizer, dataset and export go to tmp_path; its run folders (named
    uniquely under checkpoints/, logs/ and eval/) are removed afterwards. The demo corpus is the real one."""
    run = f"test-demo-{uuid.uuid4().hex[:8]}"
    args = (f"--run_name {run} --tokenizer_dir {tmp_path / 'tok'} --dataset_dir {tmp_path / 'ds'} "
            f"--export_dir {tmp_path / 'export'} --train_tokens {60 * 8 * 256} --eval_steps 30 --save_steps 60 "
            "--benchmark_items 20")
    yield run, args
    for root in ("checkpoints", "logs", "eval"):
        shutil.rmtree(PROJECT_ROOT / root / run, ignore_errors=True)


def _make_demo(demo_args: str) -> subprocess.Popen:
    """`make demo` in a session of its own, as in a terminal: a signal to the group reaches make and its children."""
    command = ["make", "-s", "demo", "STAMP=", f"PY={sys.executable}", f"DEMO_ARGS={demo_args}"]
    return subprocess.Popen(command, cwd=PROJECT_ROOT, env={**os.environ, **OFFLINE_ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _read_until(proc: subprocess.Popen, marker: str, lines: list[str], timeout: float = 240) -> None:
    found = threading.Event()

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if marker in line:
                found.set()
        found.set()

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout) and any(marker in line for line in lines), "".join(lines)[-3000:]


def test_ctrl_c_in_make_demo_saves_and_the_same_command_resumes(demo_run: tuple[str, str]) -> None:
    run, demo_args = demo_run
    first = _make_demo(demo_args)
    lines: list[str] = []
    _read_until(first, "train  step     10/60", lines)
    os.killpg(first.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
    first.wait(timeout=120)
    time.sleep(0.5)  # the reader thread takes the last lines
    out = "".join(lines)
    assert first.returncode != 0, out[-3000:]
    assert "saving a checkpoint" in out and "Traceback" not in out, out[-3000:]
    assert "demo stopped during 'training'" in out and "run the same command (make demo) to resume" in out
    run_dir = PROJECT_ROOT / "checkpoints" / run
    checkpoint = latest_complete_checkpoint(run_dir)
    assert checkpoint is not None and is_complete(checkpoint), out[-3000:]
    step = int(checkpoint.name.split("-")[1])
    assert 10 <= step < 60

    second = _make_demo(demo_args)
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out[-4000:]
    assert f"resuming the interrupted demo (checkpoints/{run}/checkpoint-{step} saved)" in out
    assert "is there: reused" in out  # the tokenizer was not trained again
    assert f"resuming from {run_dir / f'checkpoint-{step}'}" in out
    assert "demo finished" in out and (run_dir / "training_metadata.json").is_file()
    state, line = demo_state(run, out.split("--dataset_dir ")[1].split()[0], out.split("--output_dir ")[-1].split()[0])
    assert state == "finished" and "starting over" in line


def test_demo_state_tells_new_interrupted_and_finished_apart(tmp_path: Path) -> None:
    run = f"test-demo-{uuid.uuid4().hex[:8]}"
    run_dir = PROJECT_ROOT / "checkpoints" / run
    try:
        assert demo_state(run, str(tmp_path / "ds"), str(tmp_path / "export"))[0] == "new"
        (tmp_path / ".ds.building").mkdir()  # a dataset build stopped half way
        state, line = demo_state(run, str(tmp_path / "ds"), str(tmp_path / "export"))
        assert state == "interrupted" and "its dataset build stopped" in line
        (tmp_path / ".ds.building").rmdir()
        run_dir.mkdir(parents=True)
        (run_dir / "run_config.json").write_text("{}")
        assert "no checkpoint yet" in demo_state(run, str(tmp_path / "ds"), str(tmp_path / "export"))[1]
        (run_dir / "training_metadata.json").write_text("{}")  # trained, but stopped before the export
        state, line = demo_state(run, str(tmp_path / "ds"), str(tmp_path / "export"))
        assert state == "interrupted" and "its training finished" in line
        (tmp_path / "export").mkdir()
        (tmp_path / "export" / "README.md").write_text("card")
        assert demo_state(run, str(tmp_path / "ds"), str(tmp_path / "export"))[0] == "finished"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
