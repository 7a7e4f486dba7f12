"""Rows read per row trained when the stream is split among ranks, at world sizes 1, 2 and 8 (simulated: one
`SourceReader` per rank, read to its end in this process), on a sharded local Parquet source, side by side: whole
shards per rank (the split used where the shard count divides among the ranks) against every N-th row (the
fallback, and the only split before: every rank reads and parses every row and keeps its own).

Target: at most 1.1 rows read per row trained with whole shards at every world size. Every row read is counted:
besides the rows trained, each rank reads the hold-out's rows once per run to find where it ends (in which shard,
at which row), and the held-out rows of the shard that holds its end. That excess grows as world size x the
hold-out's share of the source: here the default recipe's share (VAL_TOKENS 1M of TARGET_TOKENS 1B, 0.1%), at 64
ranks about 6%. (The validation blocks themselves, computed once by each rank at a run's start, are not counted.)

Run: `.venv/bin/python bench/stream_sharding.py` (seconds).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

SHARDS = 16  # Parquet files of the source
ROWS = 2_000  # rows per file
HOLD_OUT = SHARDS * ROWS // 1000  # rows held out for validation: the default recipe's 0.1% (1M of 1B tokens)
WORLDS = [1, 2, 8]


def write_source(folder: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = []
    for shard in range(SHARDS):
        path = folder / f"part-{shard:05d}.parquet"
        pq.write_table(pa.Table.from_pylist([{"text": f"document {shard}-{row} " * 8} for row in range(ROWS)]), path)
        files.append(str(path))
    return files


def measure(files: list[str], world: int, split: str | None) -> tuple[int, int, float]:
    """(rows read over all ranks, rows trained over all ranks, seconds) for one split."""
    from sparknet.config.mix import SourceSpec
    from sparknet.data.source.rank_reader import SourceReader
    from sparknet.data.spec import HeldOutRows

    spec = SourceSpec(name="parquet", prob=1, data_files=files, label="src")
    read = trained = 0
    started = time.perf_counter()
    for rank in range(world):
        reader = SourceReader(spec, held_out=HeldOutRows(HOLD_OUT), rank=rank, world_size=world,
                              state={"split": split} if split else None)
        trained += sum(1 for _ in reader)
        read += reader.rows + reader.rows_counting
    return read, trained, time.perf_counter() - started


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        files = write_source(Path(tmp))
        print(f"source: {SHARDS} Parquet files x {ROWS:,} rows, {HOLD_OUT} rows held out for validation\n")
        print("| world size | split | rows read | rows trained | read per trained | seconds |")
        print("|---:|---|---:|---:|---:|---:|")
        for world in WORLDS:
            for split, name in ((None, "whole shards per rank"), ("every_nth", "every N-th row")):
                if world == 1 and split:
                    continue
                read, trained, seconds = measure(files, world, split)
                label = name if world > 1 else "one reader"
                print(f"| {world} | {label} | {read:,} | {trained:,} | {read / trained:.3f} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
