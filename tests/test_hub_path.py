"""The Hub path end to end, through the loopback Hub of tests/hub_server.py: the scripts read Hub ids as they read
local files (the same tokens, byte for byte), record the commit they read, and keep the HTTP client's request
lines out of the console."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sparknet.train.run_folder import latest_complete_checkpoint
from tests import hub_server
from tests.conftest import run_script, write_config, write_jsonl
from tests.hub_server import HubServer, dataset_card
from tests.test_packed_dataset import _build_until

hub = hub_server.hub
REPO = "sparknet-test/prose"
README = dataset_card("data/train-*.jsonl", "Prose for SparkNet's tests")


def _texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def _shards(texts: list[str], folder: Path, stem: str, n: int = 8) -> list[Path]:
    """`n` JSONL shards of `texts`, in order (JSONL, so that the local twin is read by the same builder under the
    same label, `prose`: the label seeds the source's shuffle)."""
    return [write_jsonl(folder / f"{stem}.{i}.jsonl", texts[i::n]) for i in range(n)]


@pytest.fixture
def prose_hub(hub: HubServer, corpus_dir: Path, tmp_path: Path) -> tuple[HubServer, str, list[Path]]:
    """The corpus's prose as a Hub dataset of eight shards, and the same shards as local files."""
    local = _shards(_texts(corpus_dir / "prose.train.jsonl"), tmp_path / "local", "prose")
    files = {f"data/train-0000{i}.jsonl": path.read_bytes() for i, path in enumerate(local)}
    sha = hub.add_dataset(REPO, {**files, "README.md": README})
    return hub, sha, local


def _build(cfg: Path, out: Path, tokenizer_dir: Path, env: dict[str, str] | None = None,  # noqa: ANN202
           *extra: object):
    return run_script("build_dataset_v5.py", "--config", cfg, "--tokenizer_dir", tokenizer_dir, "--output_dir", out,
                      "--target_tokens", 60_000, "--val_tokens", 6_000, "--num_workers", 0, *extra, env=env)


def _mix(corpus_dir: Path, tmp_path: Path, local: list[Path], prose: float = 0.5) -> tuple[Path, Path]:
    """The Hub prose plus the local code, and the same mix with the prose's local twin."""
    code = str(corpus_dir / "code.train.jsonl")
    online = write_config(tmp_path / "hub.json", [{"name": REPO, "split": "train", "prob": prose},
                                                  {"name": "json", "data_files": code, "prob": 1 - prose}])
    offline = write_config(tmp_path / "local.json", [{"name": "json", "data_files": [str(p) for p in local],
                                                      "prob": prose},
                                                     {"name": "json", "data_files": code, "prob": 1 - prose}])
    return online, offline


def test_a_build_from_a_hub_id_is_the_build_from_the_same_local_files(prose_hub, corpus_dir: Path,  # noqa: ANN001
                                                                      tokenizer_dir: Path, tmp_path: Path) -> None:
    hub, sha, local = prose_hub
    online, offline = _mix(corpus_dir, tmp_path, local)
    proc = _build(online, tmp_path / "hub-ds", tokenizer_dir, hub.env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "HTTP Request" not in proc.stderr and "HTTP/1.1" not in proc.stderr, proc.stderr[-3000:]
    assert hub.counts["resolve-get"] > 0  # read through the Hub, not from a cache
    proc = _build(offline, tmp_path / "local-ds", tokenizer_dir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "hub-ds" / name).read_bytes() == (tmp_path / "local-ds" / name).read_bytes(), name
    manifest = json.loads((tmp_path / "hub-ds" / "manifest.json").read_text())
    assert manifest["source_revisions"]["prose"] == {"revision": None, "commit": sha}
    shares = {label: s["share"] for label, s in manifest["splits"]["train"]["sources"].items()}
    local_manifest = json.loads((tmp_path / "local-ds" / "manifest.json").read_text())
    assert shares == {label: s["share"] for label, s in local_manifest["splits"]["train"]["sources"].items()}


@pytest.mark.parametrize("status", [401, 404])
def test_a_gated_or_missing_hub_dataset_is_one_line(status: int, prose_hub, tokenizer_dir: Path,  # noqa: ANN001
                                                    tmp_path: Path) -> None:
    hub, _, _ = prose_hub
    hub.fail(REPO, status)
    cfg = write_config(tmp_path / "hub.json", [{"name": REPO, "split": "train", "prob": 1.0}])
    proc = _build(cfg, tmp_path / "ds", tokenizer_dir, hub.env(tmp_path))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "packing" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert REPO in lines[0]
    if status == 401:
        assert "hf auth login" in lines[0] and "HF_TOKEN" in lines[0]
    else:
        assert "does not exist on the Hub" in lines[0]
    assert not (tmp_path / "ds").exists()


def test_a_resumed_build_reads_the_commit_it_started_on_after_the_branch_moved(
        prose_hub, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:  # noqa: ANN001
    hub, sha, local = prose_hub
    online, offline = _mix(corpus_dir, tmp_path, local)
    extra = ("--shuffle_buffer", 4, "--checkpoint_seconds", 0.05, "--read_ahead", 0)
    out = tmp_path / "ds"
    argv = [sys.executable, "scripts/build_dataset_v5.py", "--config", str(online), "--tokenizer_dir",
            str(tokenizer_dir), "--output_dir", str(out), "--target_tokens", "60000", "--val_tokens", "6000",
            "--num_workers", "2", *map(str, extra)]
    hub.latency = 0.2  # slow enough to stop it after its first saved position
    err = _build_until(argv, tmp_path / ".ds.building", lambda s: True,
                       signal.SIGINT, env=hub.env(tmp_path))
    assert "interrupted" in err, err[-3000:]
    hub.latency = 0.0
    moved = hub.add_dataset(REPO, {"data/train-00000.jsonl": "".join(
        json.dumps({"text": f"moved on {i} " * 40}) + "\n" for i in range(200)), "README.md": README})
    assert moved != sha
    proc = _build(online, out, tokenizer_dir, hub.env(tmp_path), *extra)
    assert proc.returncode == 0 and "resuming the interrupted build" in proc.stderr, proc.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["source_revisions"]["prose"]["commit"] == sha
    proc = _build(offline, tmp_path / "local-ds", tokenizer_dir, None, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("train.bin", "val.bin"):
        assert (out / name).read_bytes() == (tmp_path / "local-ds" / name).read_bytes(), name


def test_a_streamed_run_resumed_after_the_branch_moved_trains_the_blocks_of_the_commit_it_started_on(
        prose_hub, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:  # noqa: ANN001
    from tests.test_stream_training import _args
    from tests.test_training import _steps, _wait_for

    hub, sha, local = prose_hub
    online, offline = _mix(corpus_dir, tmp_path, local, prose=0.6)
    settings = dict(target_tokens=60 * 4 * 128, eval_steps=10, save_steps=10, logging_steps=5, record_batches=True)
    reference = run_script("train_sparknet.py", *_args(tmp_path / "a", offline, tokenizer_dir, **settings))
    assert reference.returncode == 0, reference.stderr[-3000:]

    args = _args(tmp_path / "b", online, tokenizer_dir, **settings)
    run_dir = tmp_path / "b" / "ckpt" / "run"
    env = {**os.environ, **hub.env(tmp_path)}
    proc = subprocess.Popen([sys.executable, "scripts/train_sparknet.py", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    _wait_for(run_dir / "checkpoint-20" / ".complete", proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "HTTP Request" not in out, out[-3000:]
    hub.add_dataset(REPO, {"data/train-00000.jsonl": "".join(
        json.dumps({"text": f"moved on {i} " * 40}) + "\n" for i in range(400)), "README.md": README})
    proc = run_script("train_sparknet.py", *args, env=hub.env(tmp_path))
    assert proc.returncode == 0 and "resuming from" in proc.stderr, proc.stderr[-3000:]
    expected, got = _steps(tmp_path / "a" / "ckpt" / "run" / "batches.jsonl"), _steps(run_dir / "batches.jsonl")
    assert sorted(got) == sorted(expected) == list(range(1, 61))
    for step in expected:
        assert got[step]["blocks"] == expected[step]["blocks"], step
    meta = json.loads((run_dir / "training_metadata.json").read_text())
    assert meta["source_revisions"]["prose"] == {"revision": None, "commit": sha}


def test_a_hub_failure_past_the_librarys_retries_is_retried_and_the_build_is_unchanged(
        prose_hub, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:  # noqa: ANN001
    """Six 503s on one data file outlast huggingface_hub's five retries (about 25 s): SparkNet opens the source
    again at the row it had reached, and the build is byte for byte the build from the local files."""
    hub, _, local = prose_hub
    online, offline = _mix(corpus_dir, tmp_path, local)
    fault = hub.fail(REPO, 503, times=6, path="data/train-00003.jsonl", kind="resolve-get")
    proc = _build(online, tmp_path / "ds", tokenizer_dir, hub.env(tmp_path), "--shuffle_buffer", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert fault.hits == 6
    warnings = [line for line in proc.stderr.splitlines() if "reading from the Hub failed" in line]
    assert len(warnings) == 1 and "source 'prose'" in warnings[0] and "retry 1 in 2 s" in warnings[0], proc.stderr
    proc = _build(offline, tmp_path / "local-ds", tokenizer_dir, None, "--shuffle_buffer", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "ds" / name).read_bytes() == (tmp_path / "local-ds" / name).read_bytes(), name


def test_a_hub_outage_longer_than_hub_retry_minutes_stops_with_one_line_and_resumes(
        prose_hub, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:  # noqa: ANN001
    hub, _, local = prose_hub
    online, _ = _mix(corpus_dir, tmp_path, local)
    hub.fail(REPO, 503, path="data/train-00003.jsonl", kind="resolve-get")
    proc = _build(online, tmp_path / "ds", tokenizer_dir, hub.env(tmp_path), "--shuffle_buffer", 4,
                  "--hub_retry_minutes", 0.1)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    error = proc.stderr.splitlines()[-1]
    assert error.startswith("error: cannot read source 'prose'") and "HUB_RETRY_MINUTES=0.1" in error, error
    assert "run the same command again" in error
    hub.clear_faults()
    proc = _build(online, tmp_path / "ds", tokenizer_dir, hub.env(tmp_path), "--shuffle_buffer", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_streamed_run_stopped_by_a_hub_outage_saves_its_last_step_and_resumes_exactly(
        prose_hub, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:  # noqa: ANN001
    """The Hub fails for good once the run is past its checkpoint at step 20: after huggingface_hub's retries and
    HUB_RETRY_MINUTES (0 here), the run saves a checkpoint of its last whole step (the blocks already read for the
    next step are taken back) and says the same command resumes; it then trains every step on the blocks of an
    uninterrupted run."""
    from tests.test_stream_training import _args
    from tests.test_training import _steps, _wait_for

    hub, _, _ = prose_hub
    # the prose's lines three by three as documents, in 64 shards: short documents, so that the encoders' batches
    # (256 documents, two ahead without encoder processes) are read all along the run and the outage hits mid-run
    lines = [line for text in _texts(corpus_dir / "prose.train.jsonl") for line in text.splitlines() if line.strip()]
    local = _shards(["\n".join(lines[i:i + 3]) for i in range(0, len(lines), 3)], tmp_path / "many", "prose", n=64)
    many = "sparknet-test-many/prose"  # the same label, prose
    hub.add_dataset(many, {**{f"data/train-{i:05d}.jsonl": p.read_bytes() for i, p in enumerate(local)},
                           "README.md": README})
    online, offline = _mix(corpus_dir, tmp_path, local)
    online.write_text(online.read_text().replace(REPO, many))
    settings = dict(target_tokens=120 * 8 * 128, eval_steps=20, save_steps=20, logging_steps=10, record_batches=True,
                    shuffle_buffer=4, global_batch_size=8, batch_size=4,  # accumulation 2: a step can be cut mid-way
                    num_workers=0)
    reference = run_script("train_sparknet.py", *_args(tmp_path / "a", offline, tokenizer_dir, **settings))
    assert reference.returncode == 0, reference.stderr[-3000:]

    args = _args(tmp_path / "b", online, tokenizer_dir, hub_retry_minutes=0, **settings)
    run_dir = tmp_path / "b" / "ckpt" / "run"
    env = {**os.environ, **hub.env(tmp_path)}
    proc = subprocess.Popen([sys.executable, "scripts/train_sparknet.py", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    _wait_for(run_dir / "checkpoint-20" / ".complete", proc)
    hub.fail(many, 503)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1 and "Traceback" not in out, out[-3000:]
    error = out.splitlines()[-1]
    assert error.startswith("error: cannot read source 'prose'") and "HUB_RETRY_MINUTES=0" in error, error
    saved = latest_complete_checkpoint(run_dir)
    assert f"checkpoint saved in {saved}: run the same command to resume" in error, error
    assert saved.name != "checkpoint-20"
    hub.clear_faults()
    proc = run_script("train_sparknet.py", *args, env=hub.env(tmp_path))
    assert proc.returncode == 0 and f"resuming from {saved}" in proc.stderr, proc.stderr[-3000:]
    expected, got = _steps(tmp_path / "a" / "ckpt" / "run" / "batches.jsonl"), _steps(run_dir / "batches.jsonl")
    assert sorted(got) == sorted(expected) == list(range(1, 121))
    for step in expected:
        assert got[step]["blocks"] == expected[step]["blocks"], step
        assert got[step]["lr"] == expected[step]["lr"], step
