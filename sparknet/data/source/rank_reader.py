"""One source read for one rank, with an exact position that can be saved and restored.

The rows of a source, in its order across its files, go through these steps:
1. the rows the validation hold-out used are dropped (`HeldOutRows`: its first `rows` rows, read in this order by
   one process), except the documents it took only the first tokens of: those come out first, marked with the token
   where training starts them (`start_token`), before any shuffling;
2. the rest is split among the ranks. Where the source's shards (its files) divide among them, rank r reads whole
   shards r, r + world_size, ... (as `datasets.distributed.split_dataset_by_node` assigns them) and nothing else,
   so each row is read once over all ranks. Otherwise the i-th row left after step 1 goes to rank
   `i % world_size`: every rank reads every row and keeps its own, world_size times the reading and parsing, with a
   warning saying so;
3. rows without text are dropped;
4. optionally, a seeded shuffle buffer of `shuffle_buffer` documents.
With `restart`, a source that runs dry is read again from its start (the hold-out's rows dropped again), as a new
pass.

Written by hand because `datasets` saves the position of a plain stream exactly (`IterableDataset.state_dict()`)
but not that of `.shuffle(buffer_size=...)`, whose buffer is lost on resume: here the buffer's texts and its random
generator's state are part of the position. Shard order is not shuffled (the buffer is the only shuffle).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from sparknet.common.errors import UserError
from sparknet.config.mix import SourceSpec
from sparknet.data.source.hub_retries import retried_open, retried_rows
from sparknet.data.source.opening import RowDocuments, open_source
from sparknet.data.spec import HeldOutRows

log = logging.getLogger(__name__)


class SourceReader:
    """Iterate for `(document, rows_read)`: this rank's documents (texts, or token-id lists of a pre-tokenized
    source, when `vocab_size` is given), and how many rows of the current pass had been read
    when the document came out (with a shuffle buffer, rows still in the buffer count as read). `start_token`, read
    after each document, is the token it starts at (the rest of a document the hold-out took the start of; else 0).

    `state()` at any point between two documents is the exact position; a reader built with that state goes on
    with the very next document.
    """

    def __init__(
        self,
        spec: SourceSpec,
        *,
        held_out: HeldOutRows | None = None,
        rank: int = 0,
        world_size: int = 1,
        restart: bool = False,
        shuffle_buffer: int = 0,
        seed: int = 0,
        state: dict[str, Any] | None = None,
        vocab_size: int | Callable[[], int] | None = None,
    ) -> None:
        self.spec = spec
        self.vocab_size = vocab_size  # a pre-tokenized source's ids are checked against it (None: text only)
        self.held_out_rows = held_out or HeldOutRows()
        self.skip = self.held_out_rows.rows  # the hold-out's rows: none of them read as a whole document
        self._rests = sorted(self.held_out_rows.rests)  # rows of those whose rest is training's, in order
        self.rank, self.world_size = rank, world_size
        self.start_token = 0
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
        self._dataset_state: dict[str, Any] | None = state.get("dataset")  # None: the start of the pass (or shard)
        self._rows: Any = None  # the pass's (or shard's) open `datasets` stream, once it has given a row
        # how the rows are split among ranks: "shards", "every_nth", or None (decided when the source is opened)
        self.split: str | None = state.get("split")
        self.shard = int(state.get("shard", 0))  # shard mode: this rank's shards done in this pass
        self.shard_rows = int(state.get("shard_rows", 0))  # shard mode: rows read of the current shard
        # shard mode: each shard's first row up to the first shard not wholly held out, found once by counting
        self.shard_starts: list[int] | None = state.get("shard_starts")
        self.rows_counting = 0  # rows read (by this object) to find where the hold-out ends

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
            "split": self.split,
            "shard": self.shard,
            "shard_rows": self.shard_rows,
            "shard_starts": self.shard_starts,
        }

    def __iter__(self) -> Iterator[tuple[str, int]]:
        for text, start in self._texts():
            # the rest of a held-out document comes out at once: a shuffle buffer holds whole documents only
            if self.buffer_size == 0 or start:
                self.start_token = start
                yield text, self.rows
                self.start_token = 0
                continue
            if len(self.buffer) < self.buffer_size:
                self.buffer.append(text)
                continue
            i = int(self.rng.integers(self.buffer_size))
            out, self.buffer[i] = self.buffer[i], text
            yield out, self.rows
        self.draining = True  # read to its end: only the buffer is left
        while self.buffer:
            i = int(self.rng.integers(len(self.buffer)))
            out = self.buffer[i]
            self.buffer[i] = self.buffer[-1]
            self.buffer.pop()
            yield out, self.rows

    def _texts(self) -> Iterator[tuple[str, int]]:
        """This rank's non-empty texts and the token each starts at, pass after pass when restarting."""
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
            self.shard, self.shard_rows = 0, 0
            log.info("source %r ran dry: restarting it from its start (pass %d)", self.spec.label, self.passes + 1)

    def _one_pass(self) -> Iterator[str]:
        rows = retried_open(self.spec)
        if self.split is None:
            self.split = self._choose_split(rows)
        if self.split == "shards":
            yield from self._own_shards(rows)
            return
        if self._dataset_state is not None:
            rows.load_state_dict(self._dataset_state)
        yield from self._texts_of(rows, self._mine, reopen=lambda: open_source(self.spec))
        self._dataset_state = rows.state_dict() if self._rows is not None else self._dataset_state
        self._rows = None

    def _choose_split(self, rows: Any) -> str:
        shards = getattr(rows, "num_shards", 1)
        if self.world_size == 1 or (shards >= self.world_size and shards % self.world_size == 0):
            return "shards" if self.world_size > 1 else "every_nth"
        if self.rank == 0:
            log.warning("source %r has %d shard(s), not a multiple of the %d processes: every process reads all its "
                        "rows and keeps 1 in %d (%dx the reading and parsing); split it into a multiple of %d files "
                        "for each process to read only its own", self.spec.label, shards, self.world_size,
                        self.world_size, self.world_size, self.world_size)
        return "every_nth"

    def _mine(self, index: int) -> tuple[bool, int]:
        """Whether row `index` (of the source, in its order) is this rank's, and the token it starts at: the i-th
        row left after the hold-out's (the rests of its cut documents first) is rank `i % world_size`'s."""
        if index < self.skip:
            if index not in self.held_out_rows.rests:
                return False, 0
            ordinal = self._rests.index(index)
        else:
            ordinal = len(self._rests) + index - self.skip
        return ordinal % self.world_size == self.rank, self.held_out_rows.rests.get(index, 0)

    def _own_shards(self, rows: Any) -> Iterator[tuple[str, int]]:
        """This rank's whole shards, in order, from the saved shard and position in it: those past the hold-out's
        rows, and those holding the rest of a document it cut (only that row of them)."""
        shards = rows.num_shards
        if self.shard_starts is None:
            self.shard_starts = self._shard_starts(rows)
        starts = self.shard_starts  # each shard's first row in the source's order, up to the first past the hold-out
        first = len(starts) - 1
        rest_shards = {max(s for s in range(len(starts)) if starts[s] <= row) for row in self._rests}
        mine = [s for s in range(self.rank, shards, self.world_size) if s >= first or s in rest_shards]
        while self.shard < len(mine):
            index = mine[self.shard]
            shard = rows.shard(num_shards=shards, index=index)
            if self._dataset_state is not None:
                shard.load_state_dict(self._dataset_state)
            begins = starts[index] if index < len(starts) else self.skip
            yield from self._texts_of(shard, lambda _row, begins=begins: self._shard_row(begins),
                                      reopen=lambda index=index: open_source(self.spec).shard(num_shards=shards,
                                                                                              index=index))
            self.shard, self.shard_rows, self._dataset_state, self._rows = self.shard + 1, 0, None, None

    def _shard_row(self, begins: int) -> tuple[bool, int]:
        """The next row of the shard that starts at row `begins` of the source: kept past the hold-out's rows, and
        where the hold-out cut its document (from that token)."""
        index = begins + self.shard_rows
        self.shard_rows += 1
        if index >= self.skip:
            return True, 0
        return index in self.held_out_rows.rests, self.held_out_rows.rests.get(index, 0)

    def _shard_starts(self, rows: Any) -> list[int]:
        """The first row (in the source's order) of each shard up to the first one not wholly held out (the last
        entry): the hold-out is the first `skip` rows, so counting them shard by shard (reading `skip` rows) finds
        where it ends."""
        starts, at = [0], 0
        if self.skip == 0:
            return starts
        for index in range(rows.num_shards):
            if at >= self.skip and index > 0:
                return starts
            read = 0  # up to one row past the hold-out: a shard that ends with it is wholly held out
            shard = rows.shard(num_shards=rows.num_shards, index=index)
            reopen = lambda index=index: open_source(self.spec).shard(num_shards=rows.num_shards, index=index)  # noqa: E731
            for _row in retried_rows(self.spec, shard, reopen, on_rows=lambda _rows: None):
                read += 1
                self.rows_counting += 1
                if at + read > self.skip:
                    return starts
            at += read
            starts.append(at)
        return starts

    def _texts_of(self, rows: Any, keep: Any, reopen: Any) -> Iterator[tuple[str, int]]:
        """The non-empty texts of the rows `keep(index in the pass)` accepts (`(kept, start token)`), with their
        start tokens; `self.rows` counts every row read. A Hub source's transient failures are retried from the
        position reached (`retried_rows`, with `reopen`)."""
        texts = RowDocuments(self.spec, self.vocab_size)
        current = [rows]
        for row in retried_rows(self.spec, rows, reopen, lambda reopened: current.__setitem__(0, reopened)):
            rows = current[0]
            self._rows = rows
            index = self.rows
            self.rows += 1
            kept, start = keep(index)
            if not kept:
                continue
            if text := texts.document(row, index, rows):
                self.documents += 1
                yield text, start


def _stable_hash(text: str) -> int:
    """A hash of the label that is the same in every process (Python's `hash` of a str is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
