"""The files of a run folder (`checkpoints/<RUN_NAME>/`) that other stages read, and their readers: the run's
settings, its metadata, a streaming run's validation blocks and their report, and the run a `checkpoint-N` belongs
to. A leaf: evaluation, export and the demo read a run through it without importing the trainer, which writes these
files (sparknet.train.folders).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparknet.common.errors import UserError

RUN_CONFIG = "run_config.json"
METADATA = "training_metadata.json"
VAL_BLOCKS = "val_blocks.npy"  # the streaming trainer's validation blocks (what the run evaluates on)
VAL_REPORT = "val_report.json"  # ... and which rows of each source they came from
VAL_SOURCES = "val_sources.npy"  # ... and the source of each of their tokens (indices into the report's source_labels)
# the weights files a model folder may hold (an index: sharded weights); a folder with none holds no model
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def run_of(folder: Path) -> Path:
    """The run folder a model folder belongs to: itself, or for a `checkpoint-N` inside a run, that run."""
    return folder.parent if checkpoint_step(folder) is not None and (folder.parent / RUN_CONFIG).is_file() else folder


def read_metadata(folder: Path) -> dict[str, Any] | None:
    """The training_metadata.json of the run `folder` is (or, a checkpoint-N, belongs to); None when it has none
    (a model trained elsewhere, a run that did not finish). The one reader of it for evaluation, export and the
    demo; a damaged file is one line naming it."""
    path = run_of(folder) / METADATA
    if not path.is_file():
        path = folder / METADATA  # a copied model folder that keeps its metadata beside it
        if not path.is_file():
            return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON ({exc}): rerun the training command, which rewrites it") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} holds no JSON object: rerun the training command, which rewrites it")
    return data


def read_val_report(path: Path) -> dict[str, Any]:
    """A streaming run's VAL_REPORT; ValueError saying why when it is damaged (not JSON, or without the rows held
    out and the commits a resume reads at)."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(report, dict) or not isinstance(report.get("blocks"), int) or not all(
            isinstance(report.get(key), dict) for key in ("rows_held_out", "held_out", "commits")) or \
            not isinstance(report.get("source_labels"), list):
        raise ValueError("not a hold-out report: no blocks, rows_held_out, held_out, commits and source_labels")
    return report


def read_val_blocks(path: Path, block_size: int | None = None, blocks: int | None = None) -> Any:
    """A streaming run's VAL_BLOCKS ([blocks, block_size] token ids, when given); ValueError saying why when it is
    damaged (cut short, other bytes, another shape)."""
    import numpy as np

    try:
        tokens = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(" ".join(str(exc).split()) or type(exc).__name__) from None
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"holds {tokens.dtype} of shape {tokens.shape}, not blocks of token ids")
    if (block_size is not None and tokens.shape[1] != block_size) or (blocks is not None and len(tokens) != blocks):
        raise ValueError(f"holds blocks of shape {tokens.shape}, expected ({blocks}, {block_size})")
    return tokens


def checkpoint_step(path: Path) -> int | None:
    """The step of a `checkpoint-N` folder, or None for anything else."""
    suffix = path.name.split("-", 1)[1] if path.name.startswith("checkpoint-") else ""
    return int(suffix) if suffix.isdigit() else None


def checkpoints_by_step(folder: Path) -> list[Path]:
    """The `checkpoint-N` folders in `folder`, lowest step first (by number: checkpoint-9 before checkpoint-10)."""
    return sorted((p for p in folder.glob("checkpoint-*") if p.is_dir() and checkpoint_step(p) is not None),
                  key=checkpoint_step)  # type: ignore[arg-type, return-value]
