"""The one packing loop: the pipeline's pieces (data/pipeline.py) cut into blocks one at a time, with the exact
position after every block. The packed build writes its blocks to the split files, the streaming trainer
(data/stream/token_stream.py) hands them to the Trainer, and the validation hold-out (data/holdout.py) takes the
first of them; all three run `StreamBlocks`, so the same settings give the same blocks.

- Pieces are concatenated as they come (each document's last piece ends with its <|endoftext|>); nothing is padded.
  A piece that does not end its document is ended where a block ends and the rest given back to its source
  (`Pipeline.give_back`), so that no <|endoftext|> is ever forged and no document is followed, inside a block, by
  another before its end. (A validation piece cut at its source's cap that ends before its block does is given
  more of its document, up to the block's end: `Pipeline.extend`.)
- In a run in phases the mixer switches to the next phase's probs before the first piece chosen once the blocks
  given reach the phase's end (`Part.phase_ends`, in blocks of this part: a whole number of its blocks per optimizer
  step, so at a step boundary); the document that crosses it ends in the next phase's first block. A phase whose
  sources all run dry before its end ends there (renormalise: nothing of it is left to mix) and the next one begins
  in the block being filled, its end where it was planned: the run loses no step, the short phase says so once. The
  switch follows from the position alone (the phase is part of it), so a resume switches where an uninterrupted
  stream does.
- A source that runs dry: `Part.on_exhausted` (renormalise: the others go on in proportion; stop: the stream ends;
  restart: the reader reads it again).

The position holds no tokens: the pipeline's, the packer's counts, and the piece being cut ("source X, its piece of
n tokens, from token k"), read again on restore.
"""

from __future__ import annotations

import copy
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparknet.common.errors import UserError
from sparknet.data.encoding.packer import BlockPacker
from sparknet.data.pipeline import Pipeline

# Who runs the loop, for its dry-source warning: under that one's logger name, saying where its mix is recorded.
# The hold-out is known by its part (Part(training=False)); the stream says so; the build constructs the loop
# without a consumer.
# consumer: (the logger its warnings go to, what the data is called in them, where its realised mix is recorded)
CONSUMERS = {
    "stream": ("sparknet.data.stream.token_stream", "the training stream",
               "ON_EXHAUSTED={on_exhausted}; the training mix is in the metadata"),
    "build": ("sparknet.data.packed.build", "the build's train split",
              "the train split's mix is in the dataset's manifest.json"),
    "validation": ("sparknet.data.holdout", "the validation hold-out",
                   "the validation split's mix is in its report: the dataset's manifest.json, or a streamed run's "
                   "val_report.json"),
}
STATE_FORMAT = 2  # of the position StreamBlocks.state_dict() gives


@dataclass
class Cutting:
    """The piece being cut into blocks: its source, its length (as packed: a piece ended with a block is shorter
    than the one read), and its tokens in the blocks given so far (negative while tokens of earlier pieces still fill
    the block it starts in). At every block given, it alone is pending."""

    label: str
    length: int
    offset: int

    @property
    def pending(self) -> bool:
        """Whether tokens of it are left for the next block (else it ended exactly with the last one)."""
        return self.offset < self.length


def initial_state(labels: list[str], settings: dict[str, Any]) -> dict[str, Any]:
    """The position at the start of a stream of the sources `labels` (StreamBlocks' format)."""
    return {
        "format": STATE_FORMAT,
        "settings": copy.deepcopy(settings),
        "blocks_yielded": 0,
        "end": None,
        "sources": {label: {"reader": None, "skip": 0} for label in labels},
        "mixer": {label: {"documents": 0, "units": 0, "exhausted": False} for label in labels},
        "packer": {"tokens": {label: 0 for label in labels}, "documents": {label: 0 for label in labels}},
        "current": None,
        "warned": [],
        "restarts": {label: 0 for label in labels},
    }


class StreamBlocks:
    """The blocks from a position (`state`, `initial_state`'s format) on: `pipeline`'s pieces packed into blocks of
    its spec's block size. `settings` is what the position is a position of (saved with it)."""

    def __init__(self, pipeline: Pipeline, state: dict[str, Any], *, settings: dict[str, Any],
                 consumer: str = "build") -> None:
        """`consumer`: "stream" or "build" (`CONSUMERS`), for a training part; a validation part is the hold-out's."""
        self.pipeline = pipeline
        self.part = pipeline.part
        self.consumer = consumer if self.part.training else "validation"
        self.sources = pipeline.sources
        self.mixer = pipeline.mixer
        self.settings = settings
        self.block_size = pipeline.spec.block_size
        self.on_exhausted = self.part.on_exhausted
        self.packer = BlockPacker(self.block_size, pipeline.spec.token_dtype)
        self.blocks_yielded = int(state["blocks_yielded"])
        self.end: str | None = state["end"]
        self.warned = set(state["warned"])
        self._restarts = dict(state["restarts"])  # at the position, before any piece of this run
        self._taken_back: Counter[str] = Counter()  # pieces handed out by a source, then given back unused
        self._current: Cutting | None = None
        self.packer.tokens_by_source = Counter(state["packer"]["tokens"])
        self.packer.documents_by_source = Counter(state["packer"]["documents"])
        self.packer.blocks = self.blocks_yielded
        if state["current"] is not None and self.end is None:
            current = state["current"]
            self._current = self._resume_cut(current["label"], int(current["length"]), int(current["offset"]))

    def _resume_cut(self, label: str, length: int, offset: int) -> Cutting:
        """The saved piece being cut, read again (and ended where it was), its rest put in the packer."""
        piece = self.pipeline.next_of(label)
        if piece is None or length > len(piece) or offset >= length:
            raise UserError(f"source {label!r} no longer holds the document the saved stream position was cutting: "
                            "its data changed since the checkpoint; start a new run")
        if len(piece) > length:
            self.pipeline.sources[label].give_back(len(piece) - length)
        self.packer.add(label, piece[offset:length])
        self.packer.documents_by_source[label] -= 1  # counted when it was first packed
        return Cutting(label, length, offset)

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
                    if dry and self.on_exhausted == "fail":
                        if item is not None:
                            pulled.append(item)  # given back below, as any piece of a block that failed to fill
                        what = CONSUMERS[self.consumer][1]
                        raise UserError(f"source {dry[0]!r} ran dry before reaching its share, in {what} "
                                        "(ON_EXHAUSTED=fail): give it more data or a lower prob, or set ON_EXHAUSTED "
                                        "to renormalise, stop or restart")
                    if item is None:
                        if self._next_phase_early():
                            continue
                        self._finish("every source ran dry")
                        return
                    if dry and self.on_exhausted == "stop":
                        self._finish(f"source {dry[0]!r} ran dry (ON_EXHAUSTED=stop)")
                        return
                    label, piece = self._ended_with_a_block(*item)
                    pulled.append((label, piece))
                    self._current = Cutting(label, len(piece), -self.packer.pending_tokens)
                    self.packer.add(label, piece)
            except BaseException:
                # a source failed while this block filled (the Hub gone for good): the position stays that of the
                # last block given, the pieces taken for this one read again on resume
                for label, piece in pulled:
                    self.mixer.take_back(label, piece)
                    self.packer.documents_by_source[label] -= 1
                    self._taken_back[label] += 1
                self._current = at_block
                raise
            block = self.packer.take(1)[0]
            assert self._current is not None
            self._current.offset += size
            self.blocks_yielded += 1
            yield block

    def _ended_with_a_block(self, label: str, piece: np.ndarray) -> tuple[str, np.ndarray]:
        """`piece`, ended where a block ends when it does not end its document: the rest given back, or, where it
        ends before the block it starts in does (a validation piece cut at its source's cap), the block filled with
        more of the document."""
        if self.pipeline.continues(label):
            over = (self.packer.pending_tokens + len(piece)) % self.block_size
            if 0 < over < len(piece):
                self.pipeline.give_back(label, over)
                return label, piece[:-over]
            if over and over == self.packer.pending_tokens + len(piece):  # within the block it starts in
                more = self.pipeline.extend(label, self.block_size - over)
                return label, np.concatenate([piece, more])
        return label, piece

    def _next_phase_at_its_start(self) -> None:
        """The next phase's probs once the blocks given reach the current phase's end (every phase passed)."""
        ends = self.part.phase_ends
        while ends is not None and self.pipeline.phase + 1 < len(ends) and \
                self.packer.tokens_added >= ends[self.pipeline.phase] * self.block_size:
            self.pipeline.start_phase(self.pipeline.phase + 1)

    def _next_phase_early(self) -> bool:
        """Where every source of a phase that is not the last ran dry, under renormalise: the next phase begins here
        (True). Under stop the stream ends there, as at any source that runs dry."""
        ends = self.part.phase_ends
        phase = self.pipeline.phase
        if ends is None or phase + 1 >= len(ends) or self.on_exhausted != "renormalise":
            return False
        phases = self.pipeline.config.phases
        name, what, where = CONSUMERS[self.consumer]
        logging.getLogger(name).warning(
            "phase %s is short: every source of it ran dry at block %d of %s, before its planned end at block %d; "
            "phase %s begins here and ends where planned (%s)", phases[phase].name, self.blocks_yielded, what,
            ends[phase], phases[phase + 1].name, where.format(on_exhausted=self.on_exhausted))
        self.pipeline.start_phase(phase + 1)
        return True

    def _unused(self) -> tuple[Cutting | None, Counter[str]]:
        """The piece being cut (if tokens of it are left) and the pieces handed out but not used, per source: the
        one being cut and those given back, read again from the position."""
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
            "current": ({"label": cutting.label, "length": int(cutting.length), "offset": int(cutting.offset)}
                        if cutting is not None else None),
            "warned": sorted(self.warned),
            "restarts": self.restarts(),
        }

    def counts(self) -> dict[str, Any]:
        """Tokens, pieces and restarts per source of the blocks given so far, dry sources, blocks, why it ended."""
        return position_counts(self.state_dict())

    def used(self, label: str) -> int:
        """Items of `label` in the blocks given (the one being cut included)."""
        return self.pipeline.used(label, self._taken_back[label])

    @property
    def cutting(self) -> Cutting | None:
        """The piece being cut, if tokens of it are left for the next block."""
        return self._unused()[0]

    def restarts(self) -> dict[str, int]:
        """Per source, the restarts before its last document used (the one being cut included; read-ahead restarts
        not counted): the passes in that document's mark `(passes, rows read)`, or the restarts so far if none was
        used yet."""
        return {label: (mark[0] if (mark := self.sources[label].mark(self.used(label))) else self._restarts[label])
                for label in self.sources}

    def _note_dry(self) -> list[str]:
        """Every source found dry so far (a warning for each, the first time)."""
        dry = self.pipeline.exhausted()
        for label in dry:
            if label not in self.warned:
                self.warned.add(label)
                if self.on_exhausted == "fail":  # the error says it
                    continue
                then = ("the stream stops here" if self.on_exhausted == "stop"
                        else "the other sources go on in proportion")
                # its realised share so far (of the tokens mixed): what the run trains on from here on differs
                total = sum(c.units for c in self.mixer.counts.values())
                count = self.mixer.counts[label]
                name, split, where = CONSUMERS[self.consumer]
                logging.getLogger(name).warning(
                    "source %r ran dry after %d documents, %.1f%% of the tokens so far (asked %.1f%%), in %s: %s (%s)",
                    label, self.packer.documents_by_source[label], 100 * count.units / max(total, 1),
                    100 * count.requested, split, then, where.format(on_exhausted=self.on_exhausted))
        return dry

    def _finish(self, reason: str) -> None:
        if self.blocks_yielded == 0:
            part = self.part
            removed = self.pipeline.removed()
            counts = ", ".join(f"{label}: {c.documents} pieces" + (
                f" after {part.held_out[label].rows} rows held out for validation" if label in part.held_out and
                part.held_out[label].rows else "") + (
                f", {removed[label]:,} document(s) dropped as repeats of validation documents" if removed[label]
                else "") for label, c in self.mixer.counts.items())
            rank = f" for rank {part.rank} of {part.world_size}" if part.world_size > 1 else ""
            fix = ("remove the repeated documents or add others" if any(removed.values())
                   else "add data, or lower BLOCK_SIZE or VAL_TOKENS")
            raise UserError(f"{reason} before one block of {self.block_size} tokens could be made{rank} ({counts}): "
                            f"{fix}")
        name, what, _where = CONSUMERS[self.consumer]
        logging.getLogger(name).warning("%s ended after %d blocks: %s", what, self.blocks_yielded, reason)
        self.end = reason
        self._current = None
        self.packer.drop_rest()


def position_counts(state: dict[str, Any]) -> dict[str, Any]:
    """What a position (`StreamBlocks.state_dict()`) has given: tokens, pieces and restarts per source, documents
    dropped for repeating a validation document, dry sources, blocks, why it ended, and the phase being mixed with
    each source's tokens mixed since it began. The one count: of the live loop and of a saved position alike."""
    mixer = state["mixer"]
    return {
        "tokens": dict(state["packer"]["tokens"]),
        "documents": {label: c["documents"] for label, c in mixer.items()},
        "validation_repeats_removed": {label: int(position.get("removed", 0))
                                       for label, position in state["sources"].items()},
        "restarts": dict(state["restarts"]),
        "exhausted": [label for label, c in mixer.items() if c["exhausted"]],
        "blocks": int(state["blocks_yielded"]),
        "end": state["end"],
        "phase": int(state.get("phase", 0)),
        "phase_tokens": {label: c["units"] for label, c in mixer.items()},
    }
