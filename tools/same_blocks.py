"""Did two runs train the same blocks, or a run the blocks of a packed dataset's train.bin? (issue 49, §5)

A run trained with RECORD_BATCHES=True writes one line per optimizer step to checkpoints/RUN_NAME/batches.jsonl
(batches.rankN.jsonl for the other processes of a torchrun): {"step", "lr", "blocks", "weights", "data_parallel"},
where "blocks" holds a digest of each block the step trained, the 8-byte blake2b of its token ids as int64
(sparknet/train/hf_trainer.py, SparkTrainer.training_step) and "weights" a hash of the weights the step starts from.
This reads those digests (a step replayed after a resume counts once, as its last record), or hashes a dataset's
train.bin blocks the same way, and compares the two as multisets: which blocks and how many times each, not their
order, which differs by design (the packed trainer draws a permutation of train.bin, the stream shuffles windows).

    python tools/same_blocks.py checkpoints/packed checkpoints/streamed   # two runs
    python tools/same_blocks.py checkpoints/streamed datasets/my-data     # a run against the build's train.bin

Each argument is a run folder (with batches*.jsonl) or a dataset folder (with manifest.json). Two runs are also
compared for their LR at each step and the weights their first step starts from (the model's initial weights, or
INIT_FROM's). The last line says `same blocks: ...` (exit 0) or `other blocks: ...` (exit 1); a folder that is
neither is one line (exit 2).

Each trainer trains steps x GLOBAL_BATCH_SIZE blocks. Where that is not train.bin's number of blocks, the runs
differ by a few blocks: the packed trainer leaves random blocks out of an epoch (it takes whole global batches) or
starts another, the stream makes blocks past train.bin's end or stops before it. Size a run to train.bin (TARGET_TOKENS
= the blocks x BLOCK_SIZE, a multiple of GLOBAL_BATCH_SIZE blocks) for the same blocks, each once.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the package beside it

import numpy as np  # noqa: E402

from sparknet.common.errors import UserError  # noqa: E402

CHUNK_BLOCKS = 65_536  # train.bin's blocks hashed per read: memory stays at one chunk as int64


def block_digest(row: np.ndarray) -> str:
    """The digest RECORD_BATCHES gives a block: blake2b (8 bytes) of its token ids as int64."""
    return hashlib.blake2b(np.ascontiguousarray(row, dtype=np.int64).tobytes(), digest_size=8).hexdigest()


def read_log(run_dir: Path) -> dict[int, list[dict]]:
    """A run's RECORD_BATCHES records by optimizer step, one per process (a step replayed after a resume: its last
    record)."""
    logs = sorted(run_dir.glob("batches*.jsonl"))
    if not logs:
        raise UserError(f"{run_dir} holds no batches.jsonl: a run folder trained with RECORD_BATCHES=True "
                        "(--record_batches true), or a dataset folder (with manifest.json)")
    steps: dict[int, list[dict]] = {}
    for log in logs:
        by_step = {}
        for line in log.read_text().splitlines():
            record = json.loads(line)
            by_step[record["step"]] = record
        for step, record in by_step.items():
            steps.setdefault(step, []).append(record)
    return steps


def run_blocks(run_dir: Path) -> tuple[Counter, int]:
    """Every block a run trained (a digest each, counted) over all its processes' logs, and its steps."""
    steps = read_log(run_dir)
    return Counter(d for records in steps.values() for record in records for d in record["blocks"]), len(steps)


def same_schedule(a: Path, b: Path) -> list[str]:
    """Two runs' LR at each step and the weights their first step starts from, each compared in a line."""
    log_a, log_b = read_log(a), read_log(b)
    lr_a = {step: records[0]["lr"] for step, records in log_a.items()}
    lr_b = {step: records[0]["lr"] for step, records in log_b.items()}
    differ = sorted(step for step in lr_a.keys() | lr_b.keys() if lr_a.get(step) != lr_b.get(step))
    first_a, first_b = log_a.get(min(log_a, default=0)), log_b.get(min(log_b, default=0))
    same_init = bool(first_a and first_b) and first_a[0]["weights"] == first_b[0]["weights"]
    return [f"the LR at every step: {'the same' if not differ else f'differs from step {differ[0]} on'}",
            f"the weights the first step starts from: {'the same' if same_init else 'other'}"]


def dataset_blocks(dataset_dir: Path) -> Counter:
    """train.bin's blocks, each hashed as RECORD_BATCHES hashes a trained block."""
    from sparknet.data.packed.dataset import PackedDataset

    tokens = PackedDataset(dataset_dir.resolve(), "train").tokens  # relative to here, not to the project
    blocks: Counter = Counter()
    for start in range(0, len(tokens), CHUNK_BLOCKS):
        blocks.update(block_digest(row) for row in np.asarray(tokens[start:start + CHUNK_BLOCKS], dtype=np.int64))
    return blocks


def blocks_of(path: Path) -> tuple[Counter, str]:
    """The blocks of a run folder or a dataset folder's train.bin, and a line describing them."""
    if (path / "manifest.json").is_file():
        blocks = dataset_blocks(path)
        return blocks, f"{path}/train.bin: {sum(blocks.values()):,} blocks ({len(blocks):,} distinct)"
    blocks, steps = run_blocks(path)
    return blocks, f"{path}: {sum(blocks.values()):,} blocks trained ({len(blocks):,} distinct) in {steps:,} steps"


def compare(a: Counter, b: Counter) -> tuple[bool, str]:
    """Whether two multisets of blocks are equal, and the verdict's line."""
    if a == b:
        return True, f"same blocks: {sum(a.values()):,}, each as many times in both (the order is not compared)"
    only_a, only_b = a - b, b - a
    return False, (f"other blocks: {sum((a & b).values()):,} in both, {sum(only_a.values()):,} only in the first "
                   f"(counting repeats), {sum(only_b.values()):,} only in the second")


def main(argv: list[str]) -> int:
    if any(arg in ("-h", "--help") for arg in argv[1:]):
        print(__doc__.strip())
        return 0
    if len(argv) != 3:
        print("usage: python tools/same_blocks.py RUN_OR_DATASET RUN_OR_DATASET (--help: what it compares)",
              file=sys.stderr)
        return 2
    first, second = Path(argv[1]), Path(argv[2])
    try:
        (a, line_a), (b, line_b) = blocks_of(first), blocks_of(second)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    same, verdict = compare(a, b)
    runs = not (first / "manifest.json").is_file() and not (second / "manifest.json").is_file()
    print("\n".join([line_a, line_b, *(same_schedule(first, second) if runs else []), verdict]))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
