"""The packed dataset on disk: one flat token file per split, and a JSON manifest written last.

Layout of a dataset folder:
    train.bin, val.bin   raw little-endian uint16/uint32 tokens, `blocks × block_size` of them, memory-mappable
    val_sources.bin      the source of each val.bin token (little-endian uint16, an index into the manifest's
                         `splits.val.source_ids.labels`, the mix's order): packing joins documents of several
                         sources in one block, so the loss per source is counted per token, not per block
    position.json        the build's position after its last block (the stream's format, data/blocks.py): a build
                         of the same inputs with a larger TARGET_TOKENS goes on from it (data/packed/build.py)
    manifest.json        format version, tokenizer hash, config, realised mixture, each file's sha256 per chunk
                         (below), ...; written last, atomically
A folder without manifest.json is not a dataset. The raw format (not Arrow) is deliberate: a numpy memmap opens a
1B-token file instantly, copies nothing into RAM and reads random blocks ~20× faster than Arrow rows.

A manifest is read in one place, `read_manifest`: its format version, then its own sha256 (`SEAL`, taken as the build
writes it), so a hand-edited or cut manifest is one line naming the file and the fix, never a KeyError where a key
is read, nor "built from other inputs".
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sparknet.common.errors import UserError

# 3: each split's sha256 per chunk; 4: the validation tokens' sources (val_sources.bin); 5: the build is the stream
# written to disk (the hold-out's cut documents trained on, pieces ended with a block, no forged <|endoftext|>), and
# keeps its end position (position.json); 6: the manifest carries its own sha256 (SEAL). A dataset in another format
# is refused in one line, never migrated.
FORMAT_VERSION = 6
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
REBUILD = "rebuild it with scripts/build_dataset_v5.py --overwrite true"
VAL_SOURCES = "val_sources.bin"
POSITION = "position.json"
SEAL = "manifest_sha256"


# What a packed dataset's token files hold, as the manifest records it: a sha256 per chunk of whole blocks of each
# file (`splits.<split>.sha256`: `chunk_blocks` and the `chunks`' hex digests), taken by the build as it writes.
#
# A size check cannot see a file of the right size with other bytes in it (a disk fault, a hand edit, a file copied
# from another build): the hashes are checked where a dataset is used, by the build before it reuses one, at the
# start of training and by evaluation, and damage is one line naming the file and its blocks.
#
# Per chunk rather than one digest of the file, because hashlib's running state cannot be saved: a resumed build
# re-hashes the part of each file it keeps (`ContentHash.of_file`), and the chunks name where damage lies. The whole
# check of a 1B-token split (2 GB) takes about 3 s on 2 cores, a dozen H200 steps (bench/content_hash.py): it is done
# whole before the first step, not chunk by chunk as blocks are read, so damage is found before anything trains on it.
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


def write_source_ids(folder: Path, ids: np.ndarray, labels: list[str], block_size: int) -> dict[str, Any]:
    """Writes the validation tokens' source ids (VAL_SOURCES); returns the manifest's `splits.val.source_ids`: the
    file, the labels the ids index, and its sha256 per chunk of whole blocks, as for the token files."""
    from sparknet.data.encoding.packer import SOURCE_ID_DTYPE

    data = np.ascontiguousarray(ids, dtype=SOURCE_ID_DTYPE)
    content = ContentHash(block_size * SOURCE_ID_DTYPE.itemsize)
    content.update(data)
    with (folder / VAL_SOURCES).open("wb") as f:
        f.write(data.tobytes())
        f.flush()
        os.fsync(f.fileno())
    return {"file": VAL_SOURCES, "labels": list(labels), "sha256": content.record()}


class SplitWriter:
    """Appends blocks to `<split>.bin`; with `blocks`, continues a file after its first `blocks` blocks (anything
    written after them, by a build interrupted before it saved its position, is cut off)."""

    def __init__(self, folder: Path, split: str, block_size: int, dtype: np.dtype, blocks: int = 0) -> None:
        self.path = folder / f"{split}.bin"
        self.block_size, self.dtype = block_size, np.dtype(dtype)
        self.blocks = blocks
        block_bytes = block_size * self.dtype.itemsize
        if blocks:
            os.truncate(self.path, blocks * block_bytes)
            self.content = ContentHash.of_file(self.path, block_bytes)  # what is kept, hashed again
        else:
            self.content = ContentHash(block_bytes)
        self._file = self.path.open("ab" if blocks else "wb")

    def sync(self) -> None:
        """Everything written so far is on disk (before a position that counts on it is saved)."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def write(self, blocks: np.ndarray) -> None:
        if blocks.size:
            data = np.ascontiguousarray(blocks, dtype=self.dtype)
            self._file.write(data.tobytes())
            self.content.update(data)
            self.blocks += blocks.shape[0]

    def close(self) -> None:
        self.sync()
        self._file.close()


def sealed(manifest: dict[str, Any]) -> dict[str, Any]:
    """`manifest` with its own sha256 (`SEAL`, of its canonical JSON without that key) added, as the build writes it:
    a manifest cut or edited since no longer matches it, whatever key it touched."""
    body = {key: value for key, value in manifest.items() if key != SEAL}
    return {**body, SEAL: hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()}


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a complete dataset, checked to be in this format and as the build wrote it (its `SEAL`), or
    None when the folder holds none. Anything else is a UserError naming the file, with the fix."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is unreadable ({exc}): {REBUILD}") from None
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if isinstance(version, int) and version != FORMAT_VERSION:  # an older dataset: said as such, not as damage
        raise UserError(f"dataset {folder} has format version {version}, and this SparkNet reads {FORMAT_VERSION}: "
                        f"{REBUILD}")
    if not isinstance(manifest, dict) or sealed(manifest).get(SEAL) != manifest.get(SEAL):
        raise UserError(f"{path} is damaged (it is not the manifest the build wrote: cut or edited since): {REBUILD}")
    return manifest


class PackedDataset:
    """One split of a packed dataset as a map-style torch Dataset of `{"input_ids", "labels"}` blocks.

    The tokens stay in a read-only memmap; each item copies only its own block. Labels equal the inputs (the model
    shifts them), and every token counts in the loss, `<|endoftext|>` included.
    """

    def __init__(self, folder: str | Path, split: str = "train") -> None:
        from sparknet.common.runtime import project_path

        self.folder = project_path(folder)
        self.split = split
        manifest = read_manifest(self.folder)
        if manifest is None:
            what = "does not exist" if not self.folder.exists() else "has no manifest.json (an unfinished build?)"
            raise UserError(f"dataset {self.folder} {what}: build it with scripts/build_dataset_v5.py")
        if split not in manifest["splits"]:
            raise UserError(f"dataset {self.folder} has no split {split!r}; splits: {', '.join(manifest['splits'])}")
        info = manifest["splits"][split]
        self.manifest = manifest
        self.block_size = manifest["block_size"]
        self.dtype = np.dtype(manifest["dtype"])
        self.blocks = info["blocks"]
        # a training split built in phases: each phase's (share of the run, first block, end block), in order
        self.phases: list[tuple[float, int, int]] | None = (
            [(float(p["run_share"]), int(p["blocks"][0]), int(p["blocks"][1])) for p in info["phases"]]
            if info.get("phases") else None)
        self.path = self.folder / info["file"]
        size = split_size_problem(self.folder, manifest, split)
        if size is not None:
            raise UserError(f"dataset {self.folder} is damaged ({size}): {REBUILD}")
        self.tokens = (
            np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.blocks, self.block_size))
            if self.blocks
            else np.zeros((0, self.block_size), dtype=self.dtype)
        )
        # the validation tokens' sources (None for the training split): [blocks, block_size] indices into the labels
        self.source_labels: list[str] = []
        self.source_ids: np.ndarray | None = None
        if "source_ids" in info:
            self.source_labels = list(info["source_ids"]["labels"])
            self.source_ids = _read_source_ids(self.folder, manifest, split)

    def verify(self, vocab_size: int | None = None) -> None:
        """The file holds what the build wrote: each chunk's sha256 is the manifest's (under 1.5 s per GB on 2
        cores, bench/content_hash.py), and, in the same pass, every token id is below `vocab_size` when given (a
        tokenizer other than the build's is one line, not an IndexError deep in the embedding). Damage is one line
        naming the file and the blocks."""

        def in_vocabulary(blocks: np.ndarray, first: int) -> None:
            top = int(blocks.max(initial=0))
            if top >= vocab_size:
                raise UserError(f"{self.path} holds token id {top} at or after position "
                                f"{first * self.block_size:,}, outside the tokenizer's vocabulary of {vocab_size}: "
                                "the file is damaged or from another build; rebuild the dataset with --overwrite true")

        damage = split_damage(self.folder, self.manifest, self.split, in_vocabulary if vocab_size else None)
        if damage is not None:
            raise UserError(f"{self.folder}/{damage}: the file is damaged; {REBUILD}")

    def __len__(self) -> int:
        return self.blocks

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        ids = torch.from_numpy(self.tokens[index].astype(np.int64))
        return {"input_ids": ids, "labels": ids}


def split_size_problem(folder: Path, manifest: dict[str, Any], split: str) -> str | None:
    """What is wrong with the size of a split's token file (of a manifest read_manifest accepted), or of its
    source-id file, or None."""
    info = manifest["splits"][split]
    problem = _size_problem(folder / info["file"], info["blocks"] * manifest["block_size"],
                            np.dtype(manifest["dtype"]))
    if problem is None and "source_ids" in info:
        problem = _source_ids_size_problem(folder, manifest, split)
    return problem


def _size_problem(path: Path, items: int, dtype: np.dtype) -> str | None:
    """What is wrong with the size of a file of `items` values of `dtype`, or None."""
    expected = items * dtype.itemsize
    size = path.stat().st_size if path.is_file() else None
    if size != expected:
        return f"{path.name} holds {'no file' if size is None else f'{size} bytes'}, expected {expected}"
    return None


def split_damage(folder: Path, manifest: dict[str, Any], split: str,
                 each_chunk: Callable[[np.ndarray, int], None] | None = None) -> str | None:
    """What is wrong with a split's token file, starting with its name: its size, else the first chunk whose sha256
    is not the manifest's; None when it is whole. `each_chunk`: another check in the same pass."""
    size = split_size_problem(folder, manifest, split)
    if size is not None:
        return size
    info = manifest["splits"][split]
    path = folder / info["file"]
    shape = (info["blocks"], manifest["block_size"])
    tokens = np.memmap(path, dtype=manifest["dtype"], mode="r", shape=shape) if info["blocks"] else np.zeros(shape)
    blocks = damaged_blocks(tokens, info["sha256"], each_chunk)
    if blocks is None:
        return _source_ids_damage(folder, manifest, split) if "source_ids" in info else None
    return f"{path.name} does not match the sha256 in its {MANIFEST} at blocks {blocks[0]}..{blocks[1]}"


def _source_ids_size_problem(folder: Path, manifest: dict[str, Any], split: str) -> str | None:
    from sparknet.data.encoding.packer import SOURCE_ID_DTYPE

    info = manifest["splits"][split]
    return _size_problem(folder / info["source_ids"]["file"], info["blocks"] * manifest["block_size"],
                         SOURCE_ID_DTYPE)


def _read_source_ids(folder: Path, manifest: dict[str, Any], split: str) -> np.ndarray:
    """A split's per-token source ids, [blocks, block_size], read whole (the validation split's: small)."""
    from sparknet.data.encoding.packer import SOURCE_ID_DTYPE

    problem = _source_ids_size_problem(folder, manifest, split)
    if problem is not None:
        raise UserError(f"dataset {folder} is damaged ({problem}): {REBUILD}")
    info = manifest["splits"][split]
    ids = np.fromfile(folder / info["source_ids"]["file"], dtype=SOURCE_ID_DTYPE)
    labels = info["source_ids"]["labels"]
    if ids.size and int(ids.max()) >= len(labels):
        raise UserError(f"{folder / info['source_ids']['file']} holds source id {int(ids.max())}, but the manifest "
                        f"names {len(labels)} source(s): the file is damaged; {REBUILD}")
    return ids.reshape(info["blocks"], manifest["block_size"])


def _source_ids_damage(folder: Path, manifest: dict[str, Any], split: str) -> str | None:
    """What is wrong with a split's source-id file of the right size: the first chunk whose sha256 differs, or
    None."""
    info = manifest["splits"][split]
    ids = _read_source_ids(folder, manifest, split)
    blocks = damaged_blocks(ids, info["source_ids"]["sha256"])
    if blocks is None:
        return None
    return (f"{info['source_ids']['file']} does not match the sha256 in its {MANIFEST} at blocks "
            f"{blocks[0]}..{blocks[1]}")
