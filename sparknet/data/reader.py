"""One source read for one rank, with an exact position that can be saved and restored.

The rows of a source, in its order across its files, go through these steps:
1. the first `skip` rows are dropped (documents held out for validation, never trained on);
2. of the rest, row i goes to rank `i % world_size` (every rank reads all rows and keeps its own, so ranks are
   disjoint whatever the number of shards, and the hold-out is the same prefix on every rank);
3. rows without text are dropped;
4. optionally, a seeded shuffle buffer of `shuffle_buffer` documents.
With `restart`, a source that runs dry is read again from its start (after the hold-out), as a new pass.

Written by hand because `datasets` saves the position of a plain stream exactly (`IterableDataset.state_dict()`)
but not that of `.shuffle(buffer_size=...)`, whose buffer is lost on resume: here the buffer's texts and its random
generator's state are part of the position. Shard order is not shuffled (the buffer is the only shuffle).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from sparknet.config import SourceSpec
from sparknet.data.sources import declared_columns, document_text, open_source, pick_text_field, read_rows, warn_no_text
from sparknet.errors import UserError

log = logging.getLogger(__name__)


class SourceReader:
    """Iterate for `(text, rows_read)`: this rank's documents, and how many rows of the current pass had been read
    when the document came out (with a shuffle buffer, rows still in the buffer count as read).

    `state()` at any point between two documents is the exact position; a reader built with that state goes on
    with the very next document.
    """

    def __init__(
        self,
        spec: SourceSpec,
        *,
        skip: int = 0,
        rank: int = 0,
        world_size: int = 1,
        restart: bool = False,
        shuffle_buffer: int = 0,
        seed: int = 0,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.spec = spec
        self.skip, self.rank, self.world_size = skip, rank, world_size
        self.restart = restart
        self.buffer_size = shuffle_buffer
        # One generator per (seed, rank, source): ranks and sources shuffle independently, runs repeat exactly.
        self.rng = np.random.default_rng([seed, rank, _stable_hash(spec.label)])
        state = state or {}
        self.passes = int(state.get("passes", 0))  # completed passes: the number of restarts
        self.rows = int(state.get("rows", 0))  # rows read in this pass (all ranks' rows, held-out ones included)
        self.documents = int(state.get("documents", 0))  # documents of this rank in this pass
        self.buffer: list[str] = list(state.get("buffer", []))
        self.draining = bool(state.get("draining", False))  # the source is dry: only the buffer is left
        if state.get("rng") is not None:
            self.rng.bit_generator.state = state["rng"]
        self._dataset_state: dict[str, Any] | None = state.get("dataset")  # None: the start of the pass
        self._rows: Any = None  # the pass's open `datasets` stream, once it has given a row

    def state(self) -> dict[str, Any]:
        """The position as plain data (JSON- and torch.save-able); its size is bounded by the buffer's texts."""
        return {
            "passes": self.passes,
            "rows": self.rows,
            "documents": self.documents,
            "dataset": self._rows.state_dict() if self._rows is not None else self._dataset_state,
            "buffer": list(self.buffer),
            "rng": self.rng.bit_generator.state if self.buffer_size else None,
            "draining": self.draining,
        }

    def __iter__(self) -> Iterator[tuple[str, int]]:
        if self.buffer_size == 0:
            for text in self._texts():
                yield text, self.rows
            return
        for text in self._texts():
            if len(self.buffer) < self.buffer_size:
                self.buffer.append(text)
                continue
            i = int(self.rng.integers(self.buffer_size))
            out, self.buffer[i] = self.buffer[i], text
            yield out, self.rows
        self.draining = True
        while self.buffer:
            i = int(self.rng.integers(len(self.buffer)))
            out = self.buffer[i]
            self.buffer[i] = self.buffer[-1]
            self.buffer.pop()
            yield out, self.rows

    def _texts(self) -> Iterator[str]:
        """This rank's non-empty texts, pass after pass when restarting."""
        if self.draining:
            return
        while True:
            yield from self._one_pass()
            if not self.restart:
                return
            if self.documents == 0:
                raise UserError(
                    f"source {self.spec.label!r} has no documents for rank {self.rank} of {self.world_size} after "
                    f"the {self.skip} rows held out for validation, so it cannot be restarted: add data, or "
                    "lower VAL_TOKENS"
                )
            self.passes += 1
            self.rows, self.documents, self._dataset_state = 0, 0, None
            log.info("source %r ran dry: restarting it from its start (pass %d)", self.spec.label, self.passes + 1)

    def _one_pass(self) -> Iterator[str]:
        rows = open_source(self.spec)
        if self._dataset_state is not None:
            rows.load_state_dict(self._dataset_state)
        field, warned = None, False
        for row in read_rows(rows, self.spec):
            self._rows = rows
            index = self.rows
            self.rows += 1
            if index < self.skip or (index - self.skip) % self.world_size != self.rank:
                continue
            if field is None:
                field = pick_text_field(row, self.spec, declared_columns(rows))
            text = document_text(row, field, self.spec)
            if text:
                self.documents += 1
                yield text
            elif not warned:
                warn_no_text(self.spec, field, index)
                warned = True
        self._dataset_state = rows.state_dict() if self._rows is not None else self._dataset_state
        self._rows = None


def _stable_hash(text: str) -> int:
    """A hash of the label that is the same in every process (Python's `hash` of a str is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
