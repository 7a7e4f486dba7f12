"""The Hub path end to end, through the loopback Hub (tests/hub_server.py): the scripts read Hub ids as they read
local files (the same tokens, byte for byte), record the commit they read, and keep the HTTP client's request
lines out of the console."""

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

from sparknet.common.runtime import PROJECT_ROOT
from sparknet.train.folders import latest_complete_checkpoint
from tests.helpers import (
    HUB_MANY,
    HUB_REPO,
    MANY_RUN,
    add_many_shards,
    build_position,
    build_until,
    hub_build,
    hub_mix,
    hub_readme,
    read_steps,
    run_script,
    stream_args,
    wait_for,
    write_config,
)
from tests.hub_server import HubServer


def _file_named(error: str) -> str:
    """The file an unreadable source's error line names: "cannot read source 'prose' (<file>): ..."."""
    named = re.search(r"cannot read source '[^']+' \(([^()]+)\): ", error)
    assert named and ", " not in named.group(1), error  # one file, not the list of the source's files
    return named.group(1)


@pytest.mark.slow  # two builds end to end; the fast tier reads a Hub id in test_hub_scripts.py (the tokenizer)
def test_a_build_from_a_hub_id_is_the_build_from_the_same_local_files(prose_hub, corpus_dir: Path,
                                                                      tokenizer_dir: Path, tmp_path: Path) -> None:
    hub, sha, local = prose_hub
    online, offline = hub_mix(corpus_dir, tmp_path, local)
    proc = hub_build(online, tmp_path / "hub-ds", tokenizer_dir, hub.env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "HTTP Request" not in proc.stderr and "HTTP/1.1" not in proc.stderr, proc.stderr[-3000:]
    assert hub.counts["resolve-get"] > 0  # read through the Hub, not from a cache
    proc = hub_build(offline, tmp_path / "local-ds", tokenizer_dir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "hub-ds" / name).read_bytes() == (tmp_path / "local-ds" / name).read_bytes(), name
    manifest = json.loads((tmp_path / "hub-ds" / "manifest.json").read_text())
    assert manifest["source_revisions"]["prose"] == {"revision": None, "commit": sha}
    shares = {label: s["share"] for label, s in manifest["splits"]["train"]["sources"].items()}
    local_manifest = json.loads((tmp_path / "local-ds" / "manifest.json").read_text())
    assert shares == {label: s["share"] for label, s in local_manifest["splits"]["train"]["sources"].items()}


# 404 in the full tier: the fast tier has a missing dataset's line from three other scripts (test_hub_scripts.py)
@pytest.mark.parametrize("status", [401, pytest.param(404, marks=pytest.mark.slow)])
def test_a_gated_or_missing_hub_dataset_is_one_line(status: int, prose_hub, tokenizer_dir: Path,
                                                    tmp_path: Path) -> None:
    hub, _, _ = prose_hub
    hub.fail(HUB_REPO, status)
    cfg = write_config(tmp_path / "hub.json", [{"name": HUB_REPO, "split": "train", "prob": 1.0}])
    proc = hub_build(cfg, tmp_path / "ds", tokenizer_dir, hub.env(tmp_path))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "packing" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert HUB_REPO in lines[0]
    if status == 401:
        assert "hf auth login" in lines[0] and "HF_TOKEN" in lines[0]
    else:
        assert "does not exist on the Hub" in lines[0]
    assert not (tmp_path / "ds").exists()


@pytest.mark.slow
def test_a_resumed_build_reads_the_commit_it_started_on_after_the_branch_moved(
        prose_hub, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    hub, sha, local = prose_hub
    online, offline = hub_mix(corpus_dir, tmp_path, local)
    extra = ("--shuffle_buffer", 4, "--checkpoint_seconds", 0.001, "--read_ahead", 0)
    out = tmp_path / "ds"
    argv = [sys.executable, "scripts/build_dataset_v5.py", "--config", str(online), "--tokenizer_dir",
            str(tokenizer_dir), "--output_dir", str(out), "--target_tokens", "60000", "--val_tokens", "6000",
            "--num_workers", "2", *map(str, extra)]
    hub.latency = 0.2  # slow enough to stop it after its first saved position
    err = build_until(argv, tmp_path / ".ds.building", lambda s: True,
                       signal.SIGINT, env=hub.env(tmp_path))
    assert "interrupted" in err, err[-3000:]
    hub.latency = 0.0
    moved = hub.add_dataset(HUB_REPO, {"data/train-00000.jsonl": "".join(
        json.dumps({"text": f"moved on {i} " * 40}) + "\n" for i in range(200)), "README.md": hub_readme()})
    assert moved != sha
    proc = hub_build(online, out, tokenizer_dir, hub.env(tmp_path), *extra)
    assert proc.returncode == 0 and "resuming the interrupted build" in proc.stderr, proc.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["source_revisions"]["prose"]["commit"] == sha
    proc = hub_build(offline, tmp_path / "local-ds", tokenizer_dir, None, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("train.bin", "val.bin"):
        assert (out / name).read_bytes() == (tmp_path / "local-ds" / name).read_bytes(), name


@pytest.mark.slow
def test_a_streamed_run_resumed_after_the_branch_moved_trains_the_blocks_of_the_commit_it_started_on(
        prose_hub, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:

    hub, sha, local = prose_hub
    online, offline = hub_mix(corpus_dir, tmp_path, local, prose=0.6)
    settings = dict(target_tokens=60 * 4 * 128, eval_steps=10, save_steps=10, logging_steps=5, record_batches=True)
    reference = run_script("train_sparknet.py", *stream_args(tmp_path / "a", offline, tokenizer_dir, **settings))
    assert reference.returncode == 0, reference.stderr[-3000:]

    args = stream_args(tmp_path / "b", online, tokenizer_dir, **settings)
    run_dir = tmp_path / "b" / "ckpt" / "run"
    env = {**os.environ, **hub.env(tmp_path)}
    proc = subprocess.Popen([sys.executable, "scripts/train_sparknet.py", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    wait_for(run_dir / "checkpoint-20" / ".complete", proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "HTTP Request" not in out, out[-3000:]
    hub.add_dataset(HUB_REPO, {"data/train-00000.jsonl": "".join(
        json.dumps({"text": f"moved on {i} " * 40}) + "\n" for i in range(400)), "README.md": hub_readme()})
    proc = run_script("train_sparknet.py", *args, env=hub.env(tmp_path))
    assert proc.returncode == 0 and "resuming from" in proc.stderr, proc.stderr[-3000:]
    expected, got = read_steps(tmp_path / "a" / "ckpt" / "run" / "batches.jsonl"), read_steps(run_dir / "batches.jsonl")
    assert sorted(got) == sorted(expected) == list(range(1, 61))
    for step in expected:
        assert got[step]["blocks"] == expected[step]["blocks"], step
    meta = json.loads((run_dir / "training_metadata.json").read_text())
    assert meta["source_revisions"]["prose"] == {"revision": None, "commit": sha}


@pytest.mark.slow
def test_a_hub_outage_longer_than_hub_retry_minutes_stops_with_one_line_and_resumes(
        hub: HubServer, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    """Once the build has saved a position, with most of the prose still to read (short documents in 64 shards,
    no read-ahead), the Hub fails for good on every data file not read yet: after HUB_RETRY_MINUTES the build stops
    with one line that names the source, the very file the Hub refused and the setting. The same command, the Hub
    back, resumes from the saved position to the build from the local files, byte for byte."""
    online, offline = hub_mix(corpus_dir, tmp_path, add_many_shards(hub, corpus_dir, tmp_path), repo=HUB_MANY)
    out, building = tmp_path / "ds", tmp_path / ".ds.building"
    extra = ("--target_tokens", 300_000, "--shuffle_buffer", 4, "--checkpoint_seconds", 0.05, "--read_ahead", 0)
    argv = [sys.executable, str(PROJECT_ROOT / "scripts" / "build_dataset_v5.py"), "--config", str(online),
            "--tokenizer_dir", str(tokenizer_dir), "--output_dir", str(out), "--val_tokens", "6000", "--num_workers",
            "0", "--hub_retry_minutes", "0.1", *map(str, extra)]
    proc = subprocess.Popen(argv, env=hub.env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 120
    while build_position(building) is None:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.01)
    # not the files already read: the source's retry reopens it, which reads a file read before again (a Hub that
    # fails on every file stops the build at that reopening, whose error names no file being read)
    read = {r.path.split("/resolve/")[1].split("/", 1)[1] for r in hub.requests if r.kind == "resolve-get"}
    for name in {f"data/train-{i:05d}.jsonl" for i in range(64)} - read:
        hub.fail(HUB_MANY, 503, path=name, kind="resolve-get")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    error = err.splitlines()[-1]
    assert error.startswith("error: cannot read source 'prose'") and "HUB_RETRY_MINUTES=0.1" in error, error
    assert "run the same command again" in error
    named = re.fullmatch(rf"hf://datasets/{HUB_MANY}@(\w+)/(data/train-\d{{5}}\.jsonl)", _file_named(error))
    assert named, error
    refused = {r.path for r in hub.requests if r.fault == "status"}
    # the file that failed (at the commit read), not any other of the source's
    assert f"/datasets/{HUB_MANY}/resolve/{named[1]}/{named[2]}" in refused, (error, refused)
    assert build_position(building) is not None  # kept to resume from
    hub.clear_faults()
    proc = run_script("build_dataset_v5.py", *argv[2:], env=hub.env(tmp_path))
    assert proc.returncode == 0 and "resuming the interrupted build" in proc.stderr, proc.stderr[-3000:]
    local = hub_build(offline, tmp_path / "local-ds", tokenizer_dir, None, *extra)
    assert local.returncode == 0, local.stderr[-3000:]
    for name in ("train.bin", "val.bin"):
        assert (out / name).read_bytes() == (tmp_path / "local-ds" / name).read_bytes(), name
    assert json.loads((out / "manifest.json").read_text())["source_revisions"]["prose"]["commit"] == named[1]


@pytest.mark.slow
def test_a_streamed_run_stopped_by_a_hub_outage_saves_its_last_step_and_resumes_exactly(
        prose_hub, many_reference: Path, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    """The Hub fails for good once the run is past its checkpoint at step 20: after huggingface_hub's retries and
    HUB_RETRY_MINUTES (0 here), the run saves a checkpoint of its last whole step (the blocks already read for the
    next step are taken back) and says the same command resumes; it then trains every step on the blocks of an
    uninterrupted run."""

    hub, _, _ = prose_hub
    # short documents in 64 shards, so that the encoders' batches (256 documents, two ahead without encoder
    # processes) are read all along the run and the outage hits mid-run
    online, _ = hub_mix(corpus_dir, tmp_path, add_many_shards(hub, corpus_dir, tmp_path), repo=HUB_MANY)
    args = stream_args(tmp_path / "b", online, tokenizer_dir, hub_retry_minutes=0, **MANY_RUN)
    run_dir = tmp_path / "b" / "ckpt" / "run"
    env = {**os.environ, **hub.env(tmp_path)}
    proc = subprocess.Popen([sys.executable, "scripts/train_sparknet.py", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    wait_for(run_dir / "checkpoint-20" / ".complete", proc)
    hub.fail(HUB_MANY, 503)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1 and "Traceback" not in out, out[-3000:]
    error = out.splitlines()[-1]
    assert error.startswith("error: cannot read source 'prose'") and "HUB_RETRY_MINUTES=0" in error, error
    named = re.fullmatch(rf"hf://datasets/{HUB_MANY}@(\w+)/(data/train-\d{{5}}\.jsonl)", _file_named(error))
    refused = {r.path for r in hub.requests if r.fault == "status"}  # the file the Hub refused, at the commit read
    assert named and f"/datasets/{HUB_MANY}/resolve/{named[1]}/{named[2]}" in refused, (error, refused)
    saved = latest_complete_checkpoint(run_dir)
    assert f"checkpoint saved in {saved}: run the same command to resume" in error, error
    assert saved.name != "checkpoint-20"
    hub.clear_faults()
    proc = run_script("train_sparknet.py", *args, env=hub.env(tmp_path))
    assert proc.returncode == 0 and f"resuming from {saved}" in proc.stderr, proc.stderr[-3000:]
    expected, got = read_steps(many_reference / "ckpt" / "run" / "batches.jsonl"), read_steps(run_dir / "batches.jsonl")
    assert sorted(got) == sorted(expected) == list(range(1, 121))
    for step in expected:
        assert got[step]["blocks"] == expected[step]["blocks"], step
        assert got[step]["lr"] == expected[step]["lr"], step
