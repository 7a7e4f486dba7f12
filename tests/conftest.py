"""Shared fixtures: a small real corpus from the standard library and a tokenizer trained on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparknet.runtime import PROJECT_ROOT

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# Offline however pytest is started: the HF libraries read these when first imported.
os.environ.update(OFFLINE_ENV)


def run_script(script: str, *args: object, cwd: Path | None = None, timeout: int = 300,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs scripts/<script> as a user would, offline (or with `env`'s variables: tests/hub_server.py's online
    ones), capturing its output."""
    env = {**os.environ, **OFFLINE_ENV, **(env or {})}
    return subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "scripts" / script), *(str(a) for a in args)],
        cwd=cwd or PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def encoder_processes(pid: int) -> list[int]:
    """The spawned encoder processes under process `pid` (not multiprocessing's resource tracker)."""
    import psutil

    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            pass
    return found


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({field: t}) + "\n")
    return path


def write_config(path: Path, mix: list[dict], **top: object) -> Path:
    data = {"seed": 1, "context_length": 128, "target_tokens": 10_000, "mix": mix, **top}
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo corpus (prose and code from the stdlib), code capped at 2 MB to keep the tests quick."""
    from sparknet.demo.corpus import write_demo_corpus

    out = tmp_path_factory.mktemp("corpus")
    write_demo_corpus(out, max_code_bytes=2 * 2**20, val_percent=5)
    return out


@pytest.fixture(scope="session")
def corpus_config(corpus_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    mix = [
        {"name": "json", "prob": 0.6, "data_files": str(corpus_dir / "prose.train.jsonl")},
        {"name": "json", "prob": 0.4, "data_files": str(corpus_dir / "code.train.jsonl")},
    ]
    return write_config(tmp_path_factory.mktemp("cfg") / "mix.json", mix, context_length=128)


@pytest.fixture(scope="session")
def tokenizer_dir(corpus_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1024-token byte-level BPE trained by the real script."""
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    proc = run_script(
        "train_tokenizer_v5.py",
        "--config",
        corpus_config,
        "--vocab_size",
        1024,
        "--max_bytes",
        300_000,
        "--heldout_docs",
        10,
        "--output_dir",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="session")
def tiny_dataset(corpus_config: Path, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packed dataset of 128-token blocks (the tiny preset's context): 100k training tokens, 4k validation."""
    from sparknet.config import load_config
    from sparknet.data.build import BuildSpec, build_dataset

    out = tmp_path_factory.mktemp("tiny") / "ds"
    build_dataset(BuildSpec(config=load_config(corpus_config), tokenizer=str(tokenizer_dir), output_dir=out,
                            target_tokens=100_000, val_tokens=4_000, block_size=128, seed=0, num_workers=0))
    return out


def random_run_folder(tokenizer_dir: Path, out: Path) -> Path:
    """A randomly initialised 2-layer GPT-2 (context 32, seed 0) with the test tokenizer, saved at `out` as a run
    folder."""
    import shutil

    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out
