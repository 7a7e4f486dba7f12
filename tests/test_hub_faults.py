"""Hub faults that outlast huggingface_hub's own retries, end to end through the scripts and the loopback Hub of
tests.hub_server: a reset connection, a rate limit and a stalled read on one data file, and an outage of the
whole repository during SparkNet's retry, each retried by SparkNet (sparknet/data/source/hub_retries.py, `retried_rows`)
from the row reached, so that the build is byte for byte the build from the same files on disk; and a rate limit in the
middle of a streamed training run, which trains every step on the blocks of a local run and counts the retry in
TensorBoard (`data/hub_retries`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparknet.common.runtime import PROJECT_ROOT
from tests.helpers import (
    HUB_MANY,
    HUB_REPO,
    MANY_RUN,
    OFFLINE_ENV,
    add_many_shards,
    hub_build,
    hub_mix,
    read_events,
    read_steps,
    read_texts,
    run_script,
    stream_args,
    write_shards,
)
from tests.hub_server import Fault, HubServer

pytestmark = pytest.mark.slow  # end-to-end scenarios: the full tier (make test-all)

FILE = "data/train-00003.jsonl"  # a shard of the Hub prose (226 kB), read once the build is under way
RETRIED = "reading from the Hub failed"  # SparkNet's retry warning
LIBRARY_RETRY_LINES = ("Retrying in 0sec", "Got disconnected from remote data host")  # datasets', left out


def _retries(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if RETRIED in line]


def _assert_same_build(out: Path, reference: Path) -> None:
    for name in ("train.bin", "val.bin"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


@pytest.fixture(scope="module")
def local_build(corpus_dir: Path, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build from the local twin of the Hub prose (same file names, so the same label and shuffle), made once
    for the module: every fault below must leave the Hub build equal to it."""
    tmp = tmp_path_factory.mktemp("local")
    local = write_shards(read_texts(corpus_dir / "prose.train.jsonl"), tmp / "local", "prose")
    _, offline = hub_mix(corpus_dir, tmp, local)
    proc = hub_build(offline, tmp / "ds", tokenizer_dir, None, "--shuffle_buffer", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "ds"


# Each fault answers six requests: huggingface_hub's first try and its five retries (1+2+4+8+8 s), so that it gives
# up and SparkNet's retry must take over. A reset or a stall cuts the file mid-body.
FAULTS: dict[str, Callable[[HubServer], Fault]] = {
    "reset": lambda hub: hub.reset_after(HUB_REPO, 100_000, times=6, path=FILE),
    "rate-limit": lambda hub: hub.fail(HUB_REPO, 429, times=6, path=FILE, kind="resolve-get", retry_after=0),
    "stall": lambda hub: hub.stall(HUB_REPO, 60, after=100, times=6, path=FILE),
}


@pytest.mark.parametrize("kind", ["reset", "rate-limit", "stall"])
def test_a_fault_past_the_librarys_retries_is_retried_once_and_the_build_is_unchanged(
        kind: str, prose_hub, local_build: Path, corpus_dir: Path, tokenizer_dir: Path,
        tmp_path: Path) -> None:
    """Each fault reaches SparkNet after huggingface_hub's retries (datasets' own are set to one try, their
    warnings left out): one retry warning, and the reopened source goes on from the row reached."""
    hub, _, local = prose_hub
    online, _ = hub_mix(corpus_dir, tmp_path, local)
    fault = FAULTS[kind](hub)
    timeout = {"HF_HUB_DOWNLOAD_TIMEOUT": 2} if kind == "stall" else {}  # not 10 s per stalled try
    proc = hub_build(online, tmp_path / "ds", tokenizer_dir, hub.env(tmp_path, **timeout), "--shuffle_buffer", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert fault.hits == 6
    warnings = _retries(proc.stderr)
    assert len(warnings) == 1 and "source 'prose'" in warnings[0], proc.stderr[-3000:]
    assert not any(line in proc.stderr for line in LIBRARY_RETRY_LINES), proc.stderr[-3000:]
    # huggingface_hub's five retries, each said once (its own handler printed them a second time, unformatted)
    assert [proc.stderr.count(f"[Retry {n}/5]") for n in range(1, 6)] == [1] * 5, proc.stderr[-3000:]
    _assert_same_build(tmp_path / "ds", local_build)


def _wait_until(condition: Callable[[], bool], proc: subprocess.Popen, stderr: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, stderr.read_text()[-3000:]
        assert time.monotonic() < deadline, stderr.read_text()[-3000:]
        time.sleep(0.05)


def test_an_outage_of_the_whole_repo_during_the_retry_is_retried_until_it_passes(
        prose_hub, local_build: Path, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    """One file fails until huggingface_hub gives up; then, while SparkNet's first retry waits, every request of the
    repository fails too, so the reopening and its read run into the outage. That is one more retry (counted on from
    the first failure), not the end, and the build is unchanged once the Hub is back.

    The second phase is a rate limit with Retry-After 0: huggingface_hub gives up each request after about 5 s, not
    23 s. The reopening itself survives it (datasets falls back to the module it cached at the first open, after its
    three HEADs fail); the re-read of the file then fails, which is SparkNet's second retry."""
    hub, _, local = prose_hub
    online, _ = hub_mix(corpus_dir, tmp_path, local)
    first = hub.fail(HUB_REPO, 503, path=FILE, kind="resolve-get")
    argv = [sys.executable, str(PROJECT_ROOT / "scripts" / "build_dataset_v5.py"), "--config", str(online),
            "--tokenizer_dir", str(tokenizer_dir), "--output_dir", str(tmp_path / "ds"), "--target_tokens", "60000",
            "--val_tokens", "6000", "--num_workers", "0", "--shuffle_buffer", "4"]
    stderr = tmp_path / "stderr.txt"  # a file, not a pipe: nobody reads a pipe while the test thread polls
    with stderr.open("w") as err:
        proc = subprocess.Popen(argv, cwd=PROJECT_ROOT, env={**os.environ, **OFFLINE_ENV, **hub.env(tmp_path)},
                                stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        _wait_until(lambda: first.hits >= 6, proc, stderr, timeout=120)  # huggingface_hub gave up
        everything = hub.fail(HUB_REPO, 429, retry_after=0)
        _wait_until(lambda: len(_retries(stderr.read_text())) >= 2, proc, stderr, timeout=120)
        hub.clear_faults()
        proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    out = stderr.read_text()
    assert proc.returncode == 0, out[-3000:]
    reopening = [r for r in hub.requests if r.fault == "status" and not r.path.endswith(FILE)]
    assert everything.hits >= 6 and reopening, "the reopening never ran into the outage"
    warnings = _retries(out)
    assert len(warnings) == 2 and all("source 'prose'" in w for w in warnings), out[-3000:]
    assert "retry 1 in 2 s" in warnings[0] and "retry 2 in 4 s" in warnings[1], warnings
    _assert_same_build(tmp_path / "ds", local_build)


def test_a_rate_limit_mid_run_is_retried_and_the_streamed_run_trains_the_same_blocks(
        hub: HubServer, many_reference: Path, corpus_dir: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    """A rate limit past huggingface_hub's retries on a shard the run reaches only mid-run (the sixth of 64 short
    shards: the first four are read at the start, the sixth around step 55 of 120): the run goes on with every step
    on the blocks of a local run, and TensorBoard's data/hub_retries goes from 0 to 1 (a total, not per source)."""

    # the outage test's dataset (tests/test_hub_path.py): short documents in 64 shards, read all along the run
    online, _ = hub_mix(corpus_dir, tmp_path, add_many_shards(hub, corpus_dir, tmp_path), repo=HUB_MANY)

    fault = hub.fail(HUB_MANY, 429, times=6, path="data/train-00005.jsonl", kind="resolve-get", retry_after=0)
    proc = run_script("train_sparknet.py", *stream_args(tmp_path / "b", online, tokenizer_dir, **MANY_RUN),
                      env=hub.env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert fault.hits == 6
    warnings = _retries(proc.stderr)
    assert len(warnings) == 1 and "source 'prose'" in warnings[0], proc.stderr[-3000:]
    expected, got = read_steps(many_reference / "ckpt" / "run" / "batches.jsonl"), \
        read_steps(tmp_path / "b" / "ckpt" / "run" / "batches.jsonl")
    assert sorted(got) == sorted(expected) == list(range(1, 121))
    for step in expected:
        assert got[step]["blocks"] == expected[step]["blocks"], step
    assert "data/hub_retries" not in read_events(many_reference / "logs" / "run")  # the local mix's run: none
    retries = read_events(tmp_path / "b" / "logs" / "run")["data/hub_retries"]
    assert [s for s, _ in retries] == list(range(10, 121, 10)), retries
    values = [v for _, v in retries]
    assert values[0] == 0 and values[-1] == 1 and values == sorted(values), retries  # mid-run, counted once
