"""An interrupted build's position, saved beside its token files, so that the next run with the same inputs goes on
from the last save instead of starting over, and still writes the files an uninterrupted build writes.

Saved every CHECKPOINT_SECONDS at a document boundary, after the token files are synced: each source's position
(its reader's, shuffle buffer included, and the documents of the batch to skip), the mixer's counts, the split being
packed, each packer's counts and pending tokens (under one block), and the blocks written per split. Written by hand
because the pipeline is ours (reader, encoder batches, mixer, packer); its "sources" and "mixer" are the
pipeline's position, as the streaming trainer saves it (data/pipeline.py). The token files are append-only: on
resume they are cut back to the blocks the position counts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from sparknet.data.encoding.packer import BlockPacker
from sparknet.data.packed.dataset import SplitWriter
from sparknet.data.pipeline import Pipeline
from sparknet.runtime import write_json_atomic

log = logging.getLogger(__name__)

STATE = "build_state.json"
STATE_FORMAT = 1


def save_state(
    folder: Path,
    *,
    saved: dict[str, Any],
    split: str,
    pipeline: Pipeline,
    packers: dict[str, BlockPacker],
    writers: dict[str, SplitWriter],
    phase_tokens: list[dict[str, int]] | None = None,
) -> None:
    """Writes the position after the documents mixed so far, with `saved` ({"inputs", "commits"}: what it is a
    position in); the packer being filled hands its full blocks to its writer first, so that only a partial block
    is kept in the state. `phase_tokens`: in a build in phases, each source's training tokens at every phase boundary
    passed."""
    block = packers[split].block_size
    writers[split].write(packers[split].take(packers[split].pending_tokens // block))
    for writer in writers.values():
        writer.sync()  # the files hold at least what the state counts, whenever the process dies
    state = {
        "format": STATE_FORMAT,
        "inputs": saved["inputs"],
        "commits": saved["commits"],
        "split": split,
        # the pipeline's position, the stream's format ("sources", "mixer"): documents taken from a source but not
        # yet mixed (the mixer's read-ahead) are read again on resume
        **pipeline.state_dict(),
        "packers": {name: packer.state_dict() for name, packer in packers.items()},
        "written": {name: writer.blocks for name, writer in writers.items()},
        "val_cut": {label: pipeline.caps.documents_cut[label] for label in pipeline.sources},
        **({"phase_tokens": phase_tokens} if phase_tokens else {}),
    }
    write_json_atomic(folder / STATE, state, compact=True)  # shuffle buffers make it large: no indentation


def load_state(folder: Path, inputs: dict[str, Any], block_bytes: int) -> dict[str, Any] | None:
    """The saved position of an interrupted build of these very inputs, or None (with the reason logged);
    `block_bytes`: the size of one block in the token files."""
    path = folder / STATE
    if not path.is_file():
        log.warning("found an interrupted build in %s that saved no position: starting over", folder)
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("found an interrupted build in %s with an unreadable position (%s): starting over", folder, exc)
        return None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or state.get("inputs") != inputs:
        log.warning("found an interrupted build in %s of other inputs: starting over", folder)
        return None
    for name, blocks in state["written"].items():
        path = folder / f"{name}.bin"
        if not path.is_file() or path.stat().st_size < blocks * block_bytes:
            log.warning("found an interrupted build in %s whose %s is shorter than its position: starting over",
                        folder, path.name)
            return None
    return state


def restore_packers(packers: dict[str, BlockPacker], state: dict[str, Any] | None) -> None:
    if state is not None:
        for name, packer in packers.items():
            packer.load_state_dict(state["packers"][name])
