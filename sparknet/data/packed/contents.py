"""What a packed dataset's token files hold, as the manifest records it: a sha256 per chunk of whole blocks of each
file (`splits.<split>.sha256`: `chunk_blocks` and the `chunks`' hex digests), taken by the build as it writes.

A size check cannot see a file of the right size with other bytes in it (a disk fault, a hand edit, a file copied
from another build): the hashes are checked where a dataset is used, by the build before it reuses one, at the
start of training and by evaluation, and damage is one line naming the file and its blocks.

Per chunk rather than one digest of the file, because hashlib's running state cannot be saved: a resumed build
re-hashes the part of each file it keeps (`ContentHash.of_file`), and the chunks name where damage lies. The whole
check of a 1B-token split (2 GB) takes about 3 s on 2 cores, a dozen H200 steps (bench/content_hash.py): it is done
whole before the first step, not chunk by chunk as blocks are read, so damage is found before anything trains on it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

CHUNK_BYTES = 64 << 20  # the bytes hashed per chunk, rounded down to whole blocks (at least one)


def chunk_blocks(block_bytes: int) -> int:
    """The blocks of `block_bytes` bytes in one chunk."""
    return max(1, CHUNK_BYTES // block_bytes)


def chunk_count(blocks: int, per_chunk: int) -> int:
    return -(-blocks // per_chunk)


class ContentHash:
    """The sha256 of each chunk of a token file written block by block; the last chunk may be partial."""

    def __init__(self, block_bytes: int) -> None:
        self.chunk_blocks = chunk_blocks(block_bytes)
        self.chunk_bytes = self.chunk_blocks * block_bytes
        self.chunks: list[str] = []
        self._current = hashlib.sha256()
        self._filled = 0  # bytes of the current chunk hashed so far

    @classmethod
    def of_file(cls, path: Path, block_bytes: int) -> ContentHash:
        """The hash of the file's bytes so far (a resumed build's, cut back to its saved position)."""
        content = cls(block_bytes)
        with path.open("rb") as f:
            while piece := f.read(content.chunk_bytes):
                content.update(piece)
        return content

    def update(self, data: bytes | np.ndarray) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            take = min(self.chunk_bytes - self._filled, view.nbytes)
            self._current.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.chunk_bytes:
                self.chunks.append(self._current.hexdigest())
                self._current, self._filled = hashlib.sha256(), 0

    def record(self) -> dict[str, Any]:
        """The manifest's `sha256` of the file: every whole chunk's, and the partial last one's."""
        partial = [self._current.hexdigest()] if self._filled else []
        return {"chunk_blocks": self.chunk_blocks, "chunks": [*self.chunks, *partial]}


def damaged_blocks(tokens: np.ndarray, record: dict[str, Any], each_chunk: Any = None) -> tuple[int, int] | None:
    """The first and last block of the first chunk of `tokens` ([blocks, block_size], e.g. a memmap) whose sha256
    is not the record's, or None when every chunk matches. `each_chunk(blocks, first_block)` is called on each chunk
    before its hash is checked (another check in the same pass over the file)."""
    per_chunk = record["chunk_blocks"]
    for index, expected in enumerate(record["chunks"]):
        first = index * per_chunk
        piece = np.ascontiguousarray(tokens[first:first + per_chunk])
        if each_chunk is not None:
            each_chunk(piece, first)
        if hashlib.sha256(memoryview(piece).cast("B")).hexdigest() != expected:
            return first, first + len(piece) - 1
    return None
