"""A Hub outage under torchrun (2 processes, CPU/gloo): the processes agree before each step whether any of them
lost the Hub, save one checkpoint of the last whole step together, and the same command resumes on the blocks
and LR of an uninterrupted run, rank by rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sparknet.train.run_folder import latest_complete_checkpoint
from sparknet.train.stream_plan import STREAM_STATE
from tests import hub_server
from tests.hub_server import HubServer
from tests.test_hub_path import README, _mix, _shards, _texts
from tests.test_stream_training import _args
from tests.test_training import _steps, _wait_for

hub = hub_server.hub
MANY = "sparknet-test-many/prose"  # label prose, as the local twin's


def _torchrun(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "scripts/train_sparknet.py", *args]
    return subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float = 400) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers: a hung run must not outlive the test
        out, _ = proc.communicate()
        raise AssertionError(f"no end after {timeout} s: {out[-3000:]}") from None
    return out


def test_two_processes_stopped_by_a_hub_outage_save_their_last_step_and_resume_exactly(
        hub: HubServer, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    from tests.conftest import OFFLINE_ENV

    # short documents in 64 shards (as in test_hub_path's one-process outage): read all along the run
    lines = [line for text in _texts(corpus_dir / "prose.train.jsonl") for line in text.splitlines() if line.strip()]
    local = _shards(["\n".join(lines[i:i + 3]) for i in range(0, len(lines), 3)], tmp_path / "many", "prose", n=64)
    hub.add_dataset(MANY, {**{f"data/train-{i:05d}.jsonl": p.read_bytes() for i, p in enumerate(local)},
                           "README.md": README})
    online, offline = _mix(corpus_dir, tmp_path, local)
    online.write_text(online.read_text().replace("sparknet-test/prose", MANY))
    settings = dict(target_tokens=80 * 8 * 128, eval_steps=20, save_steps=20, logging_steps=10, record_batches=True,
                    shuffle_buffer=4, global_batch_size=8, batch_size=2,  # 2 processes x 2 micro-batches of 2
                    num_workers=0)
    reference = _torchrun(_args(tmp_path / "a", offline, tokenizer_dir, **settings), OFFLINE_ENV)
    out = _finish(reference)
    assert reference.returncode == 0, out[-3000:]

    args = _args(tmp_path / "b", online, tokenizer_dir, hub_retry_minutes=0, **settings)
    run_dir = tmp_path / "b" / "ckpt" / "run"
    env = hub.env(tmp_path)
    proc = _torchrun(args, env)
    _wait_for(run_dir / "checkpoint-20" / ".complete", proc)
    hub.fail(MANY, 503)
    out = _finish(proc)
    assert proc.returncode != 0, out[-3000:]
    # torchrun reports a worker's non-zero exit with a traceback of its own; the workers print none
    workers = out.split("torch/distributed/elastic/multiprocessing/api.py")[0]
    assert "Traceback" not in workers, out[-3000:]
    saved = latest_complete_checkpoint(run_dir)
    assert saved is not None and saved.name != "checkpoint-20", out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert errors and all(f"checkpoint saved in {saved}: run the same command to resume" in e for e in errors), out
    assert any("cannot read source 'prose'" in e and "HUB_RETRY_MINUTES=0" in e for e in errors), errors
    for rank in (0, 1):  # every process wrote its stream position into the checkpoint
        assert (saved / STREAM_STATE.format(rank=rank)).is_file(), sorted(p.name for p in saved.iterdir())

    hub.clear_faults()
    resumed = _torchrun(args, env)
    out = _finish(resumed)
    assert resumed.returncode == 0 and f"resuming from {saved}" in out, out[-3000:]
    for log in ("batches.jsonl", "batches.rank1.jsonl"):
        expected, got = _steps(tmp_path / "a" / "ckpt" / "run" / log), _steps(run_dir / log)
        assert sorted(got) == sorted(expected) == list(range(1, 81)), log
        for step in expected:
            assert got[step]["blocks"] == expected[step]["blocks"], (log, step)
            assert got[step]["lr"] == expected[step]["lr"], (log, step)


def test_the_processes_wait_for_each_other_longer_than_a_hub_retry() -> None:
    """While one process retries the Hub, the others wait at the step's agreement: the collectives' timeout (the
    Trainer's ddp_timeout, and the CPU group's) outlasts HUB_RETRY_MINUTES."""
    from sparknet.data import hub_reads
    from sparknet.train.hf_trainer import collective_timeout_s

    assert collective_timeout_s() == 1800  # the Trainer's default, for the default 15 minutes
    hub_reads.set_hub_retry_minutes(45)
    try:
        assert collective_timeout_s() == 45 * 60 + 600
    finally:
        hub_reads.set_hub_retry_minutes(15)
