"""Shared fixtures, each built once per test run (session scope) where tests only read it: a small real corpus
from the standard library, a tokenizer trained on it, a packed dataset, a finished tiny run, a random model folder
and the loopback Hub server. Helpers (functions) are in tests/helpers.py.

The tiers: `make test` runs the tests not marked `slow` (minutes); `make test-all` runs every test, the end-to-end
scenarios (torchrun, kill -9, Hub faults, a full disk, the demo) included."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    HUB_MANY,
    HUB_REPO,
    MANY_RUN,
    OFFLINE_ENV,
    hub_mix,
    hub_readme,
    many_shards,
    random_run_folder,
    read_texts,
    run_script,
    stream_args,
    train_packed,
    train_settings,
    write_config,
    write_shards,
)
from tests.hub_server import HubServer

# Offline however pytest is started: the HF libraries read these when first imported.
os.environ.update(OFFLINE_ENV)


def shared(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """The folder `name`, made by `make` once per test run: under pytest-xdist each worker process has its own
    session fixtures, and the corpus, tokenizer and dataset were made once per worker (about 20 CPU-seconds each
    time). The first worker to ask makes it under a file lock, in the run's base folder that all workers share; the
    others wait for it and read it. Read-only for the tests, as every session fixture here."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    root.mkdir(parents=True, exist_ok=True)
    out, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.is_file():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            make(out)
            done.touch()
    return out


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo corpus (prose and code from the stdlib), code capped at 2 MB to keep the tests quick."""
    from sparknet.demo.corpus import write_demo_corpus

    return shared(tmp_path_factory, "corpus", lambda out: write_demo_corpus(out, max_code_bytes=2 * 2**20,
                                                                              val_percent=5))


@pytest.fixture(scope="session")
def corpus_config(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    mix = [
        {"name": "json", "prob": 0.6, "data_files": str(corpus_dir / "prose.train.jsonl")},
        {"name": "json", "prob": 0.4, "data_files": str(corpus_dir / "code.train.jsonl")},
    ]
    return shared(tmp_path_factory, "cfg", lambda out: write_config(out / "mix.json", mix, context_length=128)) / \
        "mix.json"


@pytest.fixture(scope="session")
def tokenizer_dir(corpus_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1024-token byte-level BPE trained by the real script."""
    def make(out: Path) -> None:
        proc = run_script("train_tokenizer_v5.py", "--config", corpus_config, "--vocab_size", 1024, "--max_bytes",
                          300_000, "--heldout_docs", 10, "--output_dir", out)
        assert proc.returncode == 0, proc.stderr

    return shared(tmp_path_factory, "tok", lambda out: make(out / "tokenizer")) / "tokenizer"


@pytest.fixture(scope="session")
def tiny_dataset(corpus_config: Path, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packed dataset of 128-token blocks (the tiny preset's context): 100k training tokens, 4k validation."""
    from sparknet.config.mix import load_config
    from sparknet.data.packed.build import BuildSpec, build_dataset

    def make(out: Path) -> None:
        build_dataset(BuildSpec(config=load_config(corpus_config), tokenizer=str(tokenizer_dir), output_dir=out,
                                target_tokens=100_000, val_tokens=4_000, block_size=128, seed=0, num_workers=0))

    return shared(tmp_path_factory, "tiny", lambda out: make(out / "ds")) / "ds"


@pytest.fixture(scope="session")
def finished(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    """A FAST packed run (40 steps, tiny preset) trained to the end in this process: (its result, its folder's
    parent). Tests only read it; one that changes a run copies it first."""
    tmp = tmp_path_factory.mktemp("train")
    result = train_packed(train_settings(tmp, peak_tflops=0.001), tiny_dataset)
    assert result.status == "finished"
    return result, tmp


@pytest.fixture(scope="session")
def random_model(tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer GPT-2 (context 32) saved with the test tokenizer, as a run folder."""
    return shared(tmp_path_factory, "models", lambda out: random_run_folder(tokenizer_dir, out / "randrun")) / "randrun"


@pytest.fixture(scope="session")
def many_reference(corpus_dir: Path, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MANY_RUN on the local twin of HUB_MANY's mix, trained once per test run by the real script: the
    uninterrupted run that the Hub-fault runs (test_hub_path, test_hub_faults) must equal. Its folder (ckpt/run,
    logs/run)."""
    def make(out: Path) -> None:
        _, offline = hub_mix(corpus_dir, out, many_shards(corpus_dir, out / "many"), repo=HUB_MANY)
        proc = run_script("train_sparknet.py", *stream_args(out / "run", offline, tokenizer_dir, **MANY_RUN))
        assert proc.returncode == 0, proc.stderr[-3000:]

    return shared(tmp_path_factory, "many-reference", make) / "run"


@pytest.fixture(scope="session")
def hub_server() -> Iterator[HubServer]:
    server = HubServer().start()
    yield server
    server.close()


@pytest.fixture
def hub(hub_server: HubServer) -> Iterator[HubServer]:
    """The loopback Hub as new (no datasets, faults or requests); a server-side exception fails the test."""
    hub_server.reset()
    yield hub_server
    errors = list(hub_server.errors)
    hub_server.reset()
    assert not errors, errors


@pytest.fixture
def prose_hub(hub: HubServer, corpus_dir: Path, tmp_path: Path) -> tuple[HubServer, str, list[Path]]:
    """The corpus's prose as a Hub dataset of eight shards (HUB_REPO), and the same shards as local files."""
    local = write_shards(read_texts(corpus_dir / "prose.train.jsonl"), tmp_path / "local", "prose")
    files = {f"data/train-0000{i}.jsonl": path.read_bytes() for i, path in enumerate(local)}
    sha = hub.add_dataset(HUB_REPO, {**files, "README.md": hub_readme()})
    return hub, sha, local


# The longest modules first, so that under `make test-all`'s worker processes (pytest-xdist, whole modules per
# worker) they start at once and the others fill in around them, instead of one starting last.
LONGEST_FIRST = ("test_demo.py", "test_hub_path.py", "test_hub_faults.py", "test_stream_training.py",
                 "test_device_count.py", "test_hub_outage_ddp.py", "test_distributed.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a module, and of the other modules, is kept
