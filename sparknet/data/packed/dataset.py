"""The packed dataset on disk: one flat token file per split, and a JSON manifest written last.

Layout of a dataset folder:
    train.bin, val.bin   raw little-endian uint16/uint32 tokens, `blocks × block_size` of them, memory-mappable
    manifest.json        format version, tokenizer hash, config, realised mixture, ...; written last, atomically
A folder without manifest.json is not a dataset. The raw format (not Arrow) is deliberate: a numpy memmap opens a
1B-token file instantly, copies nothing into RAM and reads random blocks ~20× faster than Arrow rows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from sparknet.errors import UserError

FORMAT_VERSION = 2  # a dataset in another format is refused in one line, never migrated
MANIFEST = "manifest.json"
SPLITS = ("train", "val")


class SplitWriter:
    """Appends blocks to `<split>.bin`; with `blocks`, continues a file after its first `blocks` blocks (anything
    written after them, by a build interrupted before it saved its position, is cut off)."""

    def __init__(self, folder: Path, split: str, block_size: int, dtype: np.dtype, blocks: int = 0) -> None:
        self.path = folder / f"{split}.bin"
        self.block_size, self.dtype = block_size, np.dtype(dtype)
        self.blocks = blocks
        if blocks:
            os.truncate(self.path, blocks * block_size * self.dtype.itemsize)
        self._file = self.path.open("ab" if blocks else "wb")

    def sync(self) -> None:
        """Everything written so far is on disk (before a position that counts on it is saved)."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def write(self, blocks: np.ndarray) -> None:
        if blocks.size:
            self._file.write(np.ascontiguousarray(blocks, dtype=self.dtype).tobytes())
            self.blocks += blocks.shape[0]

    def close(self) -> None:
        self.sync()
        self._file.close()


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a complete dataset, or None when the folder holds none."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is unreadable ({exc}): rebuild the dataset") from None


class PackedDataset:
    """One split of a packed dataset as a map-style torch Dataset of `{"input_ids", "labels"}` blocks.

    The tokens stay in a read-only memmap; each item copies only its own block. Labels equal the inputs (the model
    shifts them), and every token counts in the loss, `<|endoftext|>` included.
    """

    def __init__(self, folder: str | Path, split: str = "train") -> None:
        from sparknet.runtime import project_path

        self.folder = project_path(folder)
        manifest = read_manifest(self.folder)
        if manifest is None:
            what = "does not exist" if not self.folder.exists() else "has no manifest.json (an unfinished build?)"
            raise UserError(f"dataset {self.folder} {what}: build it with scripts/build_dataset_v5.py")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise UserError(
                f"dataset {self.folder} has format version {manifest.get('format_version')}, and this "
                f"SparkNet reads {FORMAT_VERSION}: rebuild it with scripts/build_dataset_v5.py (--overwrite true)"
            )
        if split not in manifest["splits"]:
            raise UserError(f"dataset {self.folder} has no split {split!r}; splits: {', '.join(manifest['splits'])}")
        info = manifest["splits"][split]
        self.manifest = manifest
        self.block_size = int(manifest["block_size"])
        self.dtype = np.dtype(manifest["dtype"])
        self.blocks = int(info["blocks"])
        path = self.path = self.folder / info["file"]
        expected = self.blocks * self.block_size * self.dtype.itemsize
        if not path.is_file() or path.stat().st_size != expected:
            size = path.stat().st_size if path.is_file() else "missing"
            raise UserError(f"{path}: expected {expected} bytes from the manifest, found {size}: rebuild the dataset")
        self.tokens = (
            np.memmap(path, dtype=self.dtype, mode="r", shape=(self.blocks, self.block_size))
            if self.blocks
            else np.zeros((0, self.block_size), dtype=self.dtype)
        )

    def check_vocabulary(self, vocab_size: int) -> None:
        """Every token id below `vocab_size`, read in chunks (about 1 s per GB from the page cache): a file of the
        right size with other bytes in it (damage, another tokenizer's build) is one line, not an IndexError deep
        in the embedding."""
        flat = self.tokens.reshape(-1)
        chunk = 1 << 26
        for start in range(0, flat.size, chunk):
            top = int(flat[start:start + chunk].max(initial=0))
            if top >= vocab_size:
                raise UserError(f"{self.path} holds token id {top} at or after position "
                                f"{start:,}, outside the tokenizer's vocabulary of {vocab_size}: the file is damaged "
                                "or from another build; rebuild the dataset with --overwrite true")

    def __len__(self) -> int:
        return self.blocks

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        ids = torch.from_numpy(self.tokens[index].astype(np.int64))
        return {"input_ids": ids, "labels": ids}
