"""One live run of the token stream from a saved position (sparknet.data.stream.TokenStream starts it): each
source's reader and encoded documents, the mixer, the packer, and the position and statistics they add up to."""

from __future__ import annotations

import copy
import logging
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from sparknet.data.mixing import Mixer
from sparknet.data.packing import BlockPacker, cut_document
from sparknet.data.prefetch import EncodedDocuments
from sparknet.data.reader import SourceReader
from sparknet.errors import UserError

log = logging.getLogger("sparknet.data.stream")  # its warnings are the stream's, under the stream's name
STATE_FORMAT = 1  # of the position TokenStream.state_dict() gives


class Pipeline:
    """One live run of the stream from a position: readers -> encoders -> mixer -> packer. `stream` is the
    TokenStream it runs for (not imported here: the stream imports this module)."""

    def __init__(self, stream: Any, state: dict[str, Any], submit: Callable[[list[str]], Any]) -> None:
        self.settings = stream.settings
        self.block_size = stream.block_size
        self.on_exhausted = stream.on_exhausted
        self.sources: dict[str, EncodedDocuments] = {}
        for spec in stream.config.mix:
            position = state["sources"][spec.label]
            reader = SourceReader(
                spec,
                skip=stream.skip_documents[spec.label],
                rank=stream.rank,
                world_size=stream.world_size,
                restart=stream.on_exhausted == "restart",
                shuffle_buffer=stream.shuffle_buffer,
                seed=stream.seed,
                state=position["reader"],
            )
            self.sources[spec.label] = EncodedDocuments(
                reader,
                submit,
                in_flight=max(2, 2 * stream.num_workers),
                max_docs=stream.batch_docs,
                max_chars=stream.batch_chars,
                skip=position["skip"],
            )
        self.caps = stream.document_caps
        costs = {label: (lambda d, c=cap: min(len(d), c)) for label, cap in (self.caps or {}).items()}
        self.mixer: Mixer[np.ndarray] = Mixer(self.sources, {s.label: s.prob for s in stream.config.mix}, cost=len,
                                              costs=costs)
        self.documents_cut: Counter[str] = Counter()
        self.mixer.load_state_dict(state["mixer"])
        self.packer = BlockPacker(self.block_size, stream.dtype, flush_tokens=sys.maxsize)
        self.blocks_yielded = int(state["blocks_yielded"])
        self.end: str | None = state["end"]
        self.warned = set(state["warned"])
        self._restarts = dict(state["restarts"])  # at the position, before any document of this run
        self._taken_back: Counter[str] = Counter()  # documents handed out by a source, then given back unused
        # The document being cut: [label, its length, its tokens in blocks given so far (negative while tokens of
        # earlier documents still fill the block it starts in)]. At every block given, it alone is pending.
        self._current: list[Any] | None = None
        current = state["current"]
        if current is not None and self.end is None:
            doc = next(self.sources[current["label"]], None)
            doc = self._cut(current["label"], doc) if doc is not None else None
            if doc is None or current["offset"] >= len(doc):
                raise UserError(f"source {current['label']!r} no longer holds the document the saved stream position "
                                "was cutting: its data changed since the checkpoint; start a new run")
            self.packer.add(current["label"], doc[current["offset"]:])
            self._current = [current["label"], len(doc), current["offset"]]
        self.packer.tokens_by_source = Counter(state["packer"]["tokens"])
        self.packer.documents_by_source = Counter(state["packer"]["documents"])
        self.packer.blocks = self.blocks_yielded
        self._mixed = iter(self.mixer)

    def blocks(self) -> Iterator[np.ndarray]:
        """The blocks from the position on, one at a time (so that every block given has an exact position)."""
        size = self.block_size
        while self.end is None:
            at_block, pulled = copy.copy(self._current), []
            try:
                while self.packer.pending_tokens < size:
                    item = next(self._mixed, None)
                    dry = self._note_dry()
                    if item is None:
                        self._finish("every source ran dry")
                        return
                    if dry and self.on_exhausted == "stop":
                        self._finish(f"source {dry[0]!r} ran dry (ON_EXHAUSTED=stop)")
                        return
                    label, doc = item
                    pulled.append(item)
                    doc = self._cut(label, doc)
                    self._current = [label, len(doc), -self.packer.pending_tokens]
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
            self._current[2] += size
            self.blocks_yielded += 1
            yield block

    def _cut(self, label: str, doc: np.ndarray) -> np.ndarray:
        if self.caps is None or len(doc) <= self.caps[label]:
            return doc
        self.documents_cut[label] += 1
        return cut_document(doc, self.caps[label])

    def state_dict(self) -> dict[str, Any]:
        current = self._current
        cutting = current is not None and current[2] < current[1]
        sources = {}
        for label, source in self.sources.items():
            # documents handed out but not used are read again: the mixer's read-ahead and the one being cut
            unused = (int(self.mixer.has_read_ahead(label)) + int(cutting and current[0] == label)
                      + self._taken_back[label])
            # a copy: the live batch records hold these dicts
            sources[label] = copy.deepcopy(source.position(source.handed_out - unused))
        return {
            "format": STATE_FORMAT,
            "settings": copy.deepcopy(self.settings),
            "blocks_yielded": self.blocks_yielded,
            "end": self.end,
            "sources": sources,
            "mixer": self.mixer.state_dict(),
            "packer": {
                "tokens": {label: int(self.packer.tokens_by_source[label]) for label in self.sources},
                "documents": {label: int(self.packer.documents_by_source[label]) for label in self.sources},
            },
            "current": {"label": current[0], "offset": int(current[2])} if cutting else None,
            "warned": sorted(self.warned),
            "restarts": self.restarts(),
        }

    def _last_used(self, label: str) -> tuple[int, int] | None:
        """(passes, rows read) of the source's last document used (the one being cut included), None if none yet."""
        source = self.sources[label]
        return source.mark(source.handed_out - int(self.mixer.has_read_ahead(label)) - self._taken_back[label])

    def restarts(self) -> dict[str, int]:
        """Per source, the restarts before its last document used (read-ahead restarts not counted)."""
        return {label: (mark[0] if (mark := self._last_used(label)) else self._restarts[label])
                for label in self.sources}

    def rows_used(self) -> dict[str, int]:
        """Per source, rows to skip so that no document used so far (the one being cut included) is read again."""
        return {label: (mark[1] if (mark := self._last_used(label)) else 0) for label in self.sources}

    def _note_dry(self) -> list[str]:
        """Every source found dry so far (a warning for each, the first time)."""
        dry = [label for label, c in self.mixer.counts.items() if c.exhausted]
        for label in dry:
            if label not in self.warned:
                self.warned.add(label)
                then = ("the stream stops here" if self.on_exhausted == "stop"
                        else "the other sources go on in proportion")
                log.warning("source %r ran dry after %d documents: %s (ON_EXHAUSTED=%s)", label,
                            self.mixer.counts[label].documents, then, self.on_exhausted)
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
