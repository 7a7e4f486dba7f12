"""One writer per target: a second dataset build into the same OUTPUT_DIR, or a second training of the same
RUN_NAME, refuses at once naming the process that holds it; a lock left by a killed process is taken over."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from sparknet.data.packed.dataset import PackedDataset
from tests.helpers import build_args, run_script, start_script, train_args, wait_for, write_config, write_jsonl

pytestmark = pytest.mark.slow  # end-to-end scenarios: the full tier (make test-all)


def _big_config(tmp_path: Path, corpus_dir: Path) -> Path:
    """A mix of one local file large enough that a build takes several seconds (the stdlib prose, repeated)."""

    texts = [json.loads(line)["text"] for line in (corpus_dir / "prose.train.jsonl").read_text().splitlines()]
    docs = [f"{i}: {texts[i % len(texts)]}" for i in range(12 * len(texts))]
    write_jsonl(tmp_path / "big.jsonl", docs)
    return write_config(tmp_path / "big.json", [{"name": "json", "prob": 1.0,
                                                  "data_files": str(tmp_path / "big.jsonl")}], context_length=128)


def test_a_second_build_into_the_same_folder_refuses_and_a_dead_builders_lock_is_taken(
        corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    config = _big_config(tmp_path, corpus_dir)
    build = [*build_args(config, out, tokenizer_dir), "--target_tokens", 4_000_000, "--checkpoint_seconds", 0.5]
    first = start_script("build_dataset_v5.py", build)
    wait_for(tmp_path / ".ds.lock.json", first)
    assert json.loads((tmp_path / ".ds.lock.json").read_text())["pid"] == first.pid
    second = run_script("build_dataset_v5.py", *build, timeout=60)
    assert first.poll() is None, "the first build ended before the second started: make it longer"
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-2000:]
    assert f"{out} is in use: a dataset build into it is running as process {first.pid}" in second.stderr
    out_first, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out_first[-2000:]
    assert len(PackedDataset(out, "train")) == 4_000_000 // 128  # the first build published whole

    # kill -9 leaves the lock file behind; the operating system has released the lock itself (another seed: a
    # rebuild from the start, not a growth, which would be over before the kill; a quarter of the tokens: it saves
    # its position every 0.5 s all the same)
    rebuild = [*build, "--target_tokens", 1_000_000, "--seed", 7, "--overwrite", "true"]
    again = start_script("build_dataset_v5.py", rebuild)
    wait_for(tmp_path / ".ds.building" / "position.json", again)
    again.send_signal(signal.SIGKILL)
    again.wait()
    holder = tmp_path / ".ds.lock.json"
    assert json.loads(holder.read_text())["pid"] == again.pid  # the killed build could not remove its record
    taken = run_script("build_dataset_v5.py", *rebuild, timeout=300)
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert len(PackedDataset(out, "train")) == 1_000_000 // 128
    assert not holder.exists()  # released on the way out


def test_a_second_training_of_the_same_run_refuses_and_a_killed_runs_lock_is_taken(tiny_dataset: Path,
                                                                                   tmp_path: Path) -> None:
    args = train_args(tmp_path, tiny_dataset, target_tokens=3000 * 4 * 128, eval_steps=50, save_steps=100,
                       sample_steps=0, logging_steps=1000)
    run_dir = tmp_path / "ckpt" / "run"
    first = start_script("train_sparknet_v5.py", args)
    wait_for(run_dir / "eval_start.json", first)
    second = run_script("train_sparknet_v5.py", *args, timeout=120)
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr[-2000:]
    assert f"{run_dir} is in use: a training run into it is running as process {first.pid}" in second.stderr
    assert len(list((tmp_path / "logs" / "run").glob("events.out.tfevents.*"))) == 1  # it wrote nothing
    first.send_signal(signal.SIGKILL)
    first.wait()
    holder = tmp_path / "ckpt" / ".run.lock.json"
    assert holder.exists()  # the killed run could not remove it; the operating system released its lock
    proc = start_script("train_sparknet_v5.py", args)
    deadline = time.time() + 120
    while not (holder.exists() and json.loads(holder.read_text() or "{}").get("pid") == proc.pid):
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.01)
    time.sleep(1.0)  # it took the dead run's lock and goes on
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in out, out[-2000:]
    assert not holder.exists()  # released on the way out
