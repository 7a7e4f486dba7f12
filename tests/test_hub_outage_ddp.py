"""A Hub outage under torchrun (2 processes, CPU/gloo): the processes agree before each step whether any of them
lost the Hub, save one checkpoint of the last whole step together, and the same command resumes on the blocks
and LR of an uninterrupted run, rank by rank."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sparknet.train.folders import latest_complete_checkpoint
from sparknet.train.stream_plan import STREAM_STATE
from tests.helpers import (
    HUB_MANY,
    OFFLINE_ENV,
    add_many_shards,
    finish,
    hub_mix,
    read_steps,
    start_script,
    stream_args,
    train_settings,
    wait_for,
)
from tests.hub_server import HubServer

if TYPE_CHECKING:
    from transformers import TrainingArguments


def _launch(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return start_script("train_sparknet.py", args, processes=2, own_group=True, env=env)


@pytest.mark.slow
def test_two_processes_stopped_by_a_hub_outage_save_their_last_step_and_resume_exactly(
        hub: HubServer, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:

    # short documents in 64 shards (as in test_hub_path's one-process outage): read all along the run
    online, offline = hub_mix(corpus_dir, tmp_path, add_many_shards(hub, corpus_dir, tmp_path), repo=HUB_MANY)
    settings = dict(target_tokens=80 * 8 * 128, eval_steps=20, save_steps=20, logging_steps=10, record_batches=True,
                    shuffle_buffer=4, global_batch_size=8, batch_size=2,  # 2 processes x 2 micro-batches of 2
                    num_workers=0,
                    shuffle_window=8)  # one step's blocks: the stream reads only a step ahead
    reference = _launch(stream_args(tmp_path / "a", offline, tokenizer_dir, **settings), OFFLINE_ENV)
    out = finish(reference)
    assert reference.returncode == 0, out[-3000:]

    args = stream_args(tmp_path / "b", online, tokenizer_dir, hub_retry_minutes=0, **settings)
    run_dir = tmp_path / "b" / "ckpt" / "run"
    env = hub.env(tmp_path)
    proc = _launch(args, env)
    wait_for(run_dir / "checkpoint-20" / ".complete", proc)
    hub.fail(HUB_MANY, 503)
    out = finish(proc)
    assert proc.returncode != 0, out[-3000:]
    # torchrun reports a worker's non-zero exit with a traceback of its own; the workers print none
    workers = out.split("torch/distributed/elastic/multiprocessing/api.py")[0]
    assert "Traceback" not in workers, out[-3000:]
    saved = latest_complete_checkpoint(run_dir)
    assert saved is not None and saved.name != "checkpoint-20", out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert errors and all(f"checkpoint saved in {saved}: run the same command to resume" in e for e in errors), out
    assert any("cannot read source 'prose'" in e and "HUB_RETRY_MINUTES=0" in e for e in errors), errors
    # each such line names the one file its process was reading when the Hub refused it (at the commit read)
    refused = {r.path for r in hub.requests if r.fault == "status"}
    for error in (e for e in errors if "cannot read source" in e):
        file = rf"hf://datasets/{HUB_MANY}@(\w+)/(data/train-\d{{5}}\.jsonl)"
        named = re.search(rf"cannot read source 'prose' \({file}\): ", error)
        assert named and f"/datasets/{HUB_MANY}/resolve/{named[1]}/{named[2]}" in refused, (error, refused)
    for rank in (0, 1):  # every process wrote its stream position into the checkpoint
        assert (saved / STREAM_STATE.format(rank=rank)).is_file(), sorted(p.name for p in saved.iterdir())

    hub.clear_faults()
    resumed = _launch(args, env)
    out = finish(resumed)
    assert resumed.returncode == 0 and f"resuming from {saved}" in out, out[-3000:]
    for log in ("batches.jsonl", "batches.rank1.jsonl"):
        expected, got = read_steps(tmp_path / "a" / "ckpt" / "run" / log), read_steps(run_dir / log)
        assert sorted(got) == sorted(expected) == list(range(1, 81)), log
        for step in expected:
            assert got[step]["blocks"] == expected[step]["blocks"], (log, step)
            assert got[step]["lr"] == expected[step]["lr"], (log, step)


def test_the_processes_wait_for_each_other_longer_than_a_hub_retry(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """While one process retries the Hub, the others wait at the step's agreement: the collectives' timeout (the
    Trainer's ddp_timeout, and the CPU group's) outlasts HUB_RETRY_MINUTES."""
    from datetime import timedelta

    import torch.distributed as dist
    from transformers import TrainerControl, TrainerState

    from sparknet.common.runtime import device_info
    from sparknet.data.source import hub_retries
    from sparknet.train.batch import plan_batch
    from sparknet.train.hf_trainer import collective_timeout_s, training_arguments
    from sparknet.train.safety import SafetyCallback

    def trainer_arguments() -> TrainingArguments:  # as the run builds them
        return training_arguments(train_settings(tmp_path), output_dir=tmp_path / "run", max_steps=10,
                                  batch=plan_batch(4, 4, 1), device=device_info(), fresh=True)

    assert collective_timeout_s() == 1800 == trainer_arguments().ddp_timeout  # the Trainer's default, for 15 min
    monkeypatch.setattr(hub_retries, "HUB_RETRY_SECONDS", hub_retries.HUB_RETRY_SECONDS)  # put back after the test
    hub_retries.set_hub_retry_minutes(45)
    assert collective_timeout_s() == 45 * 60 + 600
    arguments = trainer_arguments()
    assert arguments.ddp_timeout == 45 * 60 + 600
    # a GPU run's agreements go through a CPU (gloo) group of their own, created with the same timeout
    created: list[dict] = []
    monkeypatch.setattr(SafetyCallback, "_distributed", staticmethod(lambda: True))
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(dist, "new_group", lambda **kwargs: created.append(kwargs) or "the CPU group")
    callback = SafetyCallback(trainer=None)
    callback.on_train_begin(arguments, TrainerState(), TrainerControl())
    assert created == [{"backend": "gloo", "timeout": timedelta(seconds=45 * 60 + 600)}], created
    assert callback.group == "the CPU group"
