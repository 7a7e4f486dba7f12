"""The stream's packing: the pipeline's documents (data/pipeline.py) cut into blocks one at a time, with the exact
position after every block (sparknet.data.stream.token_stream.TokenStream runs it; data/holdout.py takes the
validation blocks with it). The position holds no tokens: the pipeline's, the packer's counts, and the document being
cut ("source X, from token k"), read again on restore.

In a run in phases the mixer switches to the next phase's probs before the first document chosen once the tokens
packed reach the phase's end (`phase_ends`, in tokens of this stream: a whole number of its blocks per optimizer
step, so at a step boundary); the document that crosses it ends in the next phase's first block. The switch follows
from the position alone (tokens packed, the phase in the pipeline's position), so a resume switches where an
uninterrupted stream does."""

from __future__ import annotations

import copy
import logging
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparknet.data.encoding.packer import BlockPacker
from sparknet.data.pipeline import Pipeline
from sparknet.errors import UserError

log = logging.getLogger("sparknet.data.stream.token_stream")  # its warnings are the stream's, under the stream's name
STATE_FORMAT = 1  # of the position TokenStream.state_dict() gives


@dataclass
class Cutting:
    """The document being cut into blocks: its source, its length, and its tokens in the blocks given so far
    (negative while tokens of earlier documents still fill the block it starts in). At every block given, it
    alone is pending."""

    label: str
    length: int
    offset: int

    @property
    def pending(self) -> bool:
        """Whether tokens of it are left for the next block (else it ended exactly with the last one)."""
        return self.offset < self.length


class StreamBlocks:
    """The blocks from a position (`state`, TokenStream's format) on: `pipeline`'s documents packed into
    `block_size` blocks of `dtype`. `settings` is what the position is a position of (saved with it);
    `on_exhausted` is TokenStream's."""

    def __init__(self, pipeline: Pipeline, state: dict[str, Any], *, block_size: int, dtype: np.dtype,
                 on_exhausted: str, settings: dict[str, Any], phase_ends: list[int] | None = None) -> None:
        self.pipeline = pipeline
        self.phase_ends = phase_ends
        self.sources = pipeline.sources
        self.mixer = pipeline.mixer
        self.settings = settings
        self.block_size = block_size
        self.on_exhausted = on_exhausted
        self.packer = BlockPacker(block_size, dtype, flush_tokens=sys.maxsize)
        self.blocks_yielded = int(state["blocks_yielded"])
        self.end: str | None = state["end"]
        self.warned = set(state["warned"])
        self._restarts = dict(state["restarts"])  # at the position, before any document of this run
        self._taken_back: Counter[str] = Counter()  # documents handed out by a source, then given back unused
        self._current: Cutting | None = None
        if state["current"] is not None and self.end is None:
            self._current = self._resume_cut(state["current"]["label"], int(state["current"]["offset"]))
        self.packer.tokens_by_source = Counter(state["packer"]["tokens"])
        self.packer.documents_by_source = Counter(state["packer"]["documents"])
        self.packer.blocks = self.blocks_yielded

    def _resume_cut(self, label: str, offset: int) -> Cutting:
        """The saved document being cut, read again, its rest put in the packer."""
        doc = self.pipeline.next_of(label)
        if doc is None or offset >= len(doc):
            raise UserError(f"source {label!r} no longer holds the document the saved stream position was cutting: "
                            "its data changed since the checkpoint; start a new run")
        self.packer.add(label, doc[offset:])
        return Cutting(label, len(doc), offset)

    def blocks(self) -> Iterator[np.ndarray]:
        """The blocks from the position on, one at a time (so that every block given has an exact position)."""
        size = self.block_size
        while self.end is None:
            at_block, pulled = copy.copy(self._current), []
            try:
                while self.packer.pending_tokens < size:
                    self._next_phase_at_its_start()
                    item = next(self.pipeline, None)
                    dry = self._note_dry()
                    if item is None:
                        self._finish("every source ran dry")
                        return
                    if dry and self.on_exhausted == "stop":
                        self._finish(f"source {dry[0]!r} ran dry (ON_EXHAUSTED=stop)")
                        return
                    label, doc = item
                    pulled.append(item)
                    self._current = Cutting(label, len(doc), -self.packer.pending_tokens)
                    self.packer.add(label, doc)
            except BaseException:
                # a source failed while this block filled (the Hub gone for good): the position stays that of the
                # last block given, the documents taken for this one read again on resume
                for label, doc in pulled:
                    self.mixer.take_back(label, doc)
                    self.packer.documents_by_source[label] -= 1
                    self._taken_back[label] += 1
                self._current = at_block
                raise
            block = self.packer.take(1)[0]
            assert self._current is not None
            self._current.offset += size
            self.blocks_yielded += 1
            yield block

    def _next_phase_at_its_start(self) -> None:
        """The next phase's probs once the tokens packed reach the current phase's end (every phase passed)."""
        ends = self.phase_ends
        while ends is not None and self.pipeline.phase + 1 < len(ends) and \
                self.packer.tokens_added >= ends[self.pipeline.phase]:
            self.pipeline.start_phase(self.pipeline.phase + 1)

    def _unused(self) -> tuple[Cutting | None, Counter[str]]:
        """The document being cut (if tokens of it are left) and the documents handed out but not used, per source:
        the one being cut and those given back, read again from the position."""
        cutting = self._current if self._current is not None and self._current.pending else None
        unused = Counter(self._taken_back)
        if cutting is not None:
            unused[cutting.label] += 1
        return cutting, unused

    def state_dict(self) -> dict[str, Any]:
        cutting, unused = self._unused()
        return {
            "format": STATE_FORMAT,
            "settings": copy.deepcopy(self.settings),
            "blocks_yielded": self.blocks_yielded,
            "end": self.end,
            **self.pipeline.state_dict(unused),
            "packer": {
                "tokens": {label: int(self.packer.tokens_by_source[label]) for label in self.sources},
                "documents": {label: int(self.packer.documents_by_source[label]) for label in self.sources},
            },
            "current": {"label": cutting.label, "offset": int(cutting.offset)} if cutting is not None else None,
            "warned": sorted(self.warned),
            "restarts": self.restarts(),
        }

    def counts(self) -> dict[str, Any]:
        """Tokens, documents and restarts per source of the blocks given so far, dry sources, blocks, why it ended."""
        return {
            "tokens": {label: int(self.packer.tokens_by_source[label]) for label in self.sources},
            "documents": {label: c.documents for label, c in self.mixer.counts.items()},
            # documents dropped for repeating a validation document
            "validation_repeats_removed": self.pipeline.removed(self._unused()[1]),
            "restarts": self.restarts(),
            "exhausted": self.pipeline.exhausted(),
            "blocks": self.blocks_yielded,
            "end": self.end,
            # the phase being mixed and each source's tokens mixed since it began
            "phase": self.pipeline.phase,
            "phase_tokens": {label: c.units for label, c in self.mixer.counts.items()},
        }

    def _last_used(self, label: str) -> tuple[int, int] | None:
        """(passes, rows read) of the source's last document used (the one being cut included), None if none yet."""
        return self.sources[label].mark(self.pipeline.used(label, self._taken_back[label]))

    def restarts(self) -> dict[str, int]:
        """Per source, the restarts before its last document used (read-ahead restarts not counted)."""
        return {label: (mark[0] if (mark := self._last_used(label)) else self._restarts[label])
                for label in self.sources}

    def rows_used(self) -> dict[str, int]:
        """Per source, rows to skip so that no document used so far (the one being cut included) is read again."""
        return {label: (mark[1] if (mark := self._last_used(label)) else 0) for label in self.sources}

    def _note_dry(self) -> list[str]:
        """Every source found dry so far (a warning for each, the first time)."""
        dry = self.pipeline.exhausted()
        for label in dry:
            if label not in self.warned:
                self.warned.add(label)
                then = ("the stream stops here" if self.on_exhausted == "stop"
                        else "the other sources go on in proportion")
                # its realised share so far (of the tokens mixed): what the run trains on from here on differs
                total = sum(c.units for c in self.mixer.counts.values())
                count = self.mixer.counts[label]
                log.warning("source %r ran dry after %d documents, %.1f%% of the tokens so far (asked %.1f%%): %s "
                            "(ON_EXHAUSTED=%s; the training mix is in the metadata)", label, count.documents,
                            100 * count.units / max(total, 1), 100 * count.requested, then, self.on_exhausted)
        return dry

    def _finish(self, reason: str) -> None:
        if self.blocks_yielded == 0:
            settings = self.settings
            skipped = settings["skip_documents"]
            counts = ", ".join(f"{label}: {c.documents} documents" + (
                f" after {skipped[label]} rows held out for validation" if skipped.get(label) else "")
                for label, c in self.mixer.counts.items())
            rank = f" for rank {settings['rank']} of {settings['world_size']}" if settings["world_size"] > 1 else ""
            # the hold-out's rows include the documents still in the shuffle buffer: a whole small source
            buffer = (f"lower SHUFFLE_BUFFER (the hold-out also skips the up to {settings['shuffle_buffer']:,} "
                      "documents in each source's shuffle buffer) below the sources' row counts, "
                      if any(skipped.values()) and settings["shuffle_buffer"] else "")
            raise UserError(
                f"{reason} before one block of {self.block_size} tokens could be made{rank} ({counts}): "
                f"{buffer}add data, or lower BLOCK_SIZE or VAL_TOKENS"
            )
        log.warning("the stream ended after %d blocks: %s", self.blocks_yielded, reason)
        self.end = reason
        self._current = None
        self.packer.finish()  # the partial rest is dropped, as in the packed build
