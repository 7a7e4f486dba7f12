"""Splitting a source among ranks: whole shards per rank where its files divide among them (each row read once over
all ranks), every N-th row otherwise (with a warning); the validation hold-out the same rows either way, and the
position exact mid-shard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparknet.config.mix import SourceSpec
from sparknet.data.source.rank_reader import SourceReader
from sparknet.data.spec import HeldOutRows

SHARDS, ROWS = 4, 5  # 4 files of 5 rows: row "s{shard}r{row}"


def _sharded(tmp_path: Path, suffix: str = "jsonl") -> SourceSpec:
    files = []
    for shard in range(SHARDS):
        path = tmp_path / f"part-{shard}.{suffix}"
        rows = [{"text": f"s{shard}r{row}"} for row in range(ROWS)]
        if suffix == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(rows), path)
        files.append(str(path))
    return SourceSpec(name="json" if suffix == "jsonl" else "parquet", prob=1, data_files=files, label="src")


def _all_rows() -> list[str]:
    return [f"s{s}r{r}" for s in range(SHARDS) for r in range(ROWS)]


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
@pytest.mark.parametrize("skip", [0, 3, 7, 10])
def test_whole_shards_per_rank_read_each_row_once_and_hold_out_the_same_rows(tmp_path: Path, suffix: str,
                                                                            skip: int) -> None:
    spec = _sharded(tmp_path, suffix)
    readers = [SourceReader(spec, held_out=HeldOutRows(skip), rank=r, world_size=2) for r in range(2)]
    texts = [[t for t, _ in reader] for reader in readers]
    assert all(reader.split == "shards" for reader in readers)
    # the hold-out is the first `skip` rows in the source's order, as on one process
    assert sorted(texts[0] + texts[1]) == sorted(_all_rows()[skip:])
    assert not set(texts[0]) & set(texts[1])
    assert all(t[1] in "02" for t in texts[0]) and all(t[1] in "13" for t in texts[1])  # shards 0, 2 and 1, 3
    # rows read over both ranks: the rows trained, plus the held-out rows of the shards they still read from
    assert sum(reader.rows for reader in readers) == SHARDS * ROWS - (skip // ROWS) * ROWS


def test_a_shard_count_that_does_not_divide_falls_back_to_every_nth_row_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = _sharded(tmp_path)
    with caplog.at_level("WARNING"):
        readers = [SourceReader(spec, held_out=HeldOutRows(7), rank=r, world_size=3) for r in range(3)]
        texts = [[t for t, _ in reader] for reader in readers]
    assert [reader.split for reader in readers] == ["every_nth"] * 3
    assert sorted(sum(texts, [])) == sorted(_all_rows()[7:])
    assert all(reader.rows == SHARDS * ROWS for reader in readers)  # each read every row
    warning = [r.getMessage() for r in caplog.records if "not a multiple" in r.getMessage()]
    assert len(warning) == 1 and "4 shard(s), not a multiple of the 3 processes" in warning[0]
    assert "3x the reading" in warning[0]


@pytest.mark.parametrize("buffer", [0, 3])
def test_the_position_mid_shard_resumes_exactly(tmp_path: Path, buffer: int) -> None:
    spec = _sharded(tmp_path)
    whole = [t for t, _ in SourceReader(spec, held_out=HeldOutRows(7), rank=1, world_size=2, shuffle_buffer=buffer,
                                        seed=3)]
    for cut in range(len(whole)):
        reader = SourceReader(spec, held_out=HeldOutRows(7), rank=1, world_size=2, shuffle_buffer=buffer, seed=3)
        it = iter(reader)
        first = [next(it)[0] for _ in range(cut)]
        state = json.loads(json.dumps(reader.state()))  # as saved in a checkpoint
        rest = [t for t, _ in SourceReader(spec, held_out=HeldOutRows(7), rank=1, world_size=2,
                                           shuffle_buffer=buffer, seed=3, state=state)]
        assert first + rest == whole, cut


def test_restart_reads_the_rank_s_shards_again_after_the_hold_out(tmp_path: Path) -> None:
    spec = _sharded(tmp_path)
    reader = SourceReader(spec, held_out=HeldOutRows(7), rank=0, world_size=2, restart=True)
    it = iter(reader)
    one_pass = [f"s2r{r}" for r in range(ROWS)]  # rank 0's shards are 0 and 2, and shard 0 is wholly held out
    assert [next(it)[0] for _ in range(2 * ROWS)] == one_pass + one_pass and reader.passes == 1


@pytest.mark.parametrize("world", [1, 2, 3])  # one process; whole shards; every 3rd row
def test_the_rest_of_a_document_the_hold_out_cut_is_read_once_over_the_ranks_first_from_its_token(
        tmp_path: Path, world: int) -> None:
    spec = _sharded(tmp_path)
    held = HeldOutRows(rows=7, rests={2: 5, 6: 1})  # rows s0r2 and s1r1: training takes them from those tokens
    read = []
    for rank in range(world):
        reader = SourceReader(spec, held_out=held, rank=rank, world_size=world, shuffle_buffer=3, seed=1)
        mine = [(text, reader.start_token) for text, _ in reader]
        rests = [item for item in mine if item[1]]
        assert mine[:len(rests)] == rests  # before anything the shuffle buffer holds
        read += mine
    assert sorted(read) == sorted([("s0r2", 5), ("s1r1", 1), *((text, 0) for text in _all_rows()[7:])])
