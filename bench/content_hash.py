"""What the content hashes of a packed dataset cost (sparknet/data/packed/dataset.py), against a training step.

A token file of TOKENS random uint16 tokens is written twice, plainly and through the build's SplitWriter (which
hashes as it writes); then, from the page cache, the check the trainer and evaluation run at their start
(`PackedDataset.verify`: sha256 per chunk and ids against the vocabulary, one pass), the hash alone, and the ids alone
(the check before the hashes). A training step of PRESET (STEP_BLOCKS blocks of 1024 tokens, forward, backward and
AdamW, on this machine's CPU) is timed beside it, and the reference recipe's step on one H200 is taken from
bench/RESULTS.md (128 × 1024 tokens at 510,354 tokens/s, compiled). Rounds alternate; medians are printed.

Run: `.venv/bin/python bench/content_hash.py` (2 GB in a temporary folder; about two minutes on 2 cores);
`--tokens 200000000` for a smaller file (the costs are per byte).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

TOKENS = 1_000_000_000  # tokens in the file (1B: the reference dataset's training split, 2 GB)
ROUNDS = 3  # each check this many times
PRESET = "sparknet-70m"  # the reference run's model
STEP_BLOCKS = 1  # blocks of 1024 tokens per timed training step on this machine
VOCAB = 50257  # the reference tokenizer's vocabulary
H200_STEP_SECONDS = 128 * 1024 / 510_354  # the reference recipe's step, compiled, on one H200 (bench/RESULTS.md)

BLOCK = 1024


def write_file(folder: Path, hashed: bool) -> tuple[float, dict]:
    """Writes TOKENS tokens in 64 MB pieces (the random numbers drawn beforehand, outside the timing)."""
    import numpy as np

    from sparknet.data.packed.dataset import SplitWriter

    rng = np.random.default_rng(0)
    piece = rng.integers(0, VOCAB, size=(32768, BLOCK), dtype=np.uint16)
    blocks = TOKENS // BLOCK
    started = time.perf_counter()
    if not hashed:
        with (folder / "train.bin").open("wb") as f:
            for start in range(0, blocks, len(piece)):
                f.write(piece[: min(len(piece), blocks - start)].tobytes())
        return time.perf_counter() - started, {}
    writer = SplitWriter(folder, "train", BLOCK, np.dtype(np.uint16))
    for start in range(0, blocks, len(piece)):
        writer.write(piece[: min(len(piece), blocks - start)])
    writer.close()
    return time.perf_counter() - started, writer.content.record()


def time_checks(dataset: object) -> dict[str, float]:
    """The checks at the start of training, from the page cache (a first pass puts the file there, as a just-built
    or just-read one is)."""
    dataset.verify()
    checks = {
        "verify: sha256 and ids, one pass": lambda: dataset.verify(VOCAB),
        "sha256 alone": lambda: dataset.verify(),
        "ids alone": lambda: [int(dataset.tokens[i:i + 32768].max()) for i in range(0, len(dataset), 32768)],
    }
    seconds = {}
    for name, check in checks.items():
        started = time.perf_counter()
        check()
        seconds[name] = time.perf_counter() - started
    return seconds


def training_step() -> float:
    """One step of PRESET on STEP_BLOCKS blocks (the second of two: the first pays for the allocations)."""
    import torch

    from sparknet.model.presets import build_model, get_preset

    model = build_model(get_preset(PRESET), VOCAB, eos_token_id=VOCAB - 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, VOCAB, (STEP_BLOCKS, BLOCK))
    seconds = 0.0
    for _ in range(2):
        started = time.perf_counter()
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - started
    return seconds


def main() -> None:
    import json
    import logging

    from sparknet.common import runtime
    from sparknet.data.packed.dataset import FORMAT_VERSION, PackedDataset, sealed

    runtime.setup(0, level=logging.WARNING)
    gigabytes = TOKENS * 2 / 1e9
    rows: dict[str, list[float]] = {"write, plain": [], "write through SplitWriter (hashing)": [],
                                    "verify: sha256 and ids, one pass": [], "sha256 alone": [], "ids alone": []}
    with tempfile.TemporaryDirectory(prefix="sparknet-hash-") as tmp:
        folder = Path(tmp)
        record: dict = {}
        for round_ in range(ROUNDS):
            rows["write, plain"].append(write_file(folder, hashed=False)[0])
            seconds, record = write_file(folder, hashed=True)
            rows["write through SplitWriter (hashing)"].append(seconds)
            blocks = TOKENS // BLOCK
            split = {"file": "train.bin", "blocks": blocks, "tokens": blocks * BLOCK, "documents": 0, "sources": {},
                     "sha256": record}
            manifest = {"format_version": FORMAT_VERSION, "inputs": {}, "block_size": BLOCK, "dtype": "uint16",
                        "tokenizer": {"path": "-", "sha256": "-", "vocab_size": VOCAB, "eos_token_id": VOCAB - 1},
                        "config": {"path": "-", "mix": [], "target_tokens": 0}, "build_seconds": 0,
                        "splits": {"train": split, "val": {**split, "file": "val.bin", "blocks": 0, "tokens": 0,
                                                           "sha256": {**record, "chunks": []}}}}
            (folder / "val.bin").touch()
            (folder / "manifest.json").write_text(json.dumps(sealed(manifest)))
            for name, seconds in time_checks(PackedDataset(folder, "train")).items():
                rows[name].append(seconds)
            print(f"round {round_ + 1}: " + ", ".join(f"{name} {values[-1]:.2f} s" for name, values in rows.items()),
                  flush=True)
    step = training_step()
    print(f"\n[content hash] {TOKENS:,} tokens ({gigabytes:.2f} GB uint16), {len(record['chunks'])} chunks of "
          f"{record['chunk_blocks']} blocks, median of {ROUNDS}; one training step of {PRESET} at {STEP_BLOCKS} × "
          f"{BLOCK} on this CPU: {step:.2f} s; the reference recipe's step on one H200: {H200_STEP_SECONDS:.3f} s")
    print("| what | seconds | s per GB | / CPU step | / H200 step |\n|---|---:|---:|---:|---:|")
    for name, values in rows.items():
        seconds = statistics.median(values)
        print(f"| {name} | {seconds:.2f} | {seconds / gigabytes:.2f} | {seconds / step:.2f} | "
              f"{seconds / H200_STEP_SECONDS:.1f} |")


if __name__ == "__main__":
    from sparknet.config.cli import run_script

    run_script(globals(), main)
