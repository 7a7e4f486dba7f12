"""One source's documents encoded ahead in batches, while knowing where every handed-out document sits in the source.

Texts are read in batches (up to `max_docs` documents or `max_chars` characters) and submitted for encoding, with
at most `in_flight` batches submitted ahead, as the packed build does: memory is bounded, whatever the source's
size. Each batch remembers the reader's position before its first text, so the position of any document not yet
consumed is "that batch's start, then skip k documents": saving it costs nothing per document, and restoring it
re-reads (and re-encodes) at most one batch instead of keeping documents that were read but not yet mixed.

With `read_ahead`, a thread per source reads batches ahead (up to `read_ahead` of them, each with the reader's
position before and after it), so that sources are read in parallel with each other and with the encoding: reading
a Hub source waits on the network, and parsing Parquet or JSON releases the GIL.

Written by hand because `datasets.map(batched=True)` saves a stream's position but cannot say which of the
documents it has already encoded were actually used.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparknet.data.source.rank_reader import SourceReader


class Done:
    """An already finished 'async' result, for encoding in this process."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


@dataclass
class _Batch:
    start: dict[str, Any]  # the reader's position before the batch's first text
    dropped: int  # texts at the batch's start that were consumed before a restore: read again, not encoded
    first: int  # index of its first encoded document among the documents handed out
    marks: list[tuple[int, int]]  # per encoded document: (reader passes, rows of the pass read) when it came out
    start_tokens: list[int]  # per encoded document: the token it starts at (the rest of a held-out document; else 0)
    result: Any = None  # the pending encoding, then None
    docs: list[np.ndarray] = field(default_factory=list)

    def __contains__(self, index: int) -> bool:
        return self.first <= index < self.first + len(self.marks)


class EncodedDocuments:
    """Iterate for one token array per document (eos appended), in the reader's order; a document the reader marks
    with a start token (`SourceReader.start_token`) comes out from that token on.

    `submit(texts)` starts encoding a batch and returns an object whose `get()` gives `(flat tokens, lengths)`.
    `skip` documents at the reader's position are dropped first (a restored position's "then skip k").
    """

    def __init__(
        self,
        reader: SourceReader,
        submit: Callable[[list[str]], Any],
        *,
        in_flight: int,
        max_docs: int = 256,
        max_chars: int = 1 << 20,
        skip: int = 0,
        read_ahead: int = 0,
    ) -> None:
        self.reader = reader
        self._texts = iter(reader)
        self._end_state = reader.state()  # the reader's position after the last batch read (taken)
        self._submit = submit
        self._in_flight = max(1, in_flight)
        self._max_docs, self._max_chars = max_docs, max_chars
        self._skip = skip
        self.handed_out = 0  # documents given to the consumer
        self._read = 0  # documents read and submitted (handed out or not)
        self._dry = False
        self._pending: deque[_Batch] = deque()  # submitted, not yet opened
        self._current: _Batch | None = None  # being handed out
        self._taken = 0  # documents of the current batch handed out
        self._done: deque[_Batch] = deque(maxlen=3)  # the last batches handed out, for positions a little back
        self._raw: Iterator[Any] = self._raw_batches()
        self._ahead: _ReadAhead | None = None
        if read_ahead > 0:
            self._ahead = _ReadAhead(self._raw, read_ahead)
            self._raw = self._ahead

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        while self._current is None or self._taken == len(self._current.docs):
            if self._current is not None:
                self._current.docs = []
                self._done.append(self._current)
                self._current = None
            self._top_up()
            if not self._pending:
                raise StopIteration
            batch = self._pending.popleft()
            flat, lengths = batch.result.get()
            batch.result = None
            batch.docs = np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []
            batch.docs = [doc[start:] if start else doc
                          for doc, start in zip(batch.docs, batch.start_tokens, strict=True)]
            self._current, self._taken = batch, 0
            self._top_up()  # keep the workers busy while this batch is handed out
        doc = self._current.docs[self._taken]
        self._taken += 1
        self.handed_out += 1
        return doc

    def position(self, consumed: int) -> dict[str, Any]:
        """The position of document `consumed` (the first of those handed out that the consumer has not used):
        `{"reader": reader state, "skip": documents to drop after it}`."""
        if consumed == self._read:  # everything read so far is used: the position after the last batch read
            return {"reader": self._end_state, "skip": self._skip}  # a restored skip not yet applied stays
        batch = self._batch_of(consumed)
        return {"reader": batch.start, "skip": batch.dropped + consumed - batch.first}

    def mark(self, consumed: int) -> tuple[int, int] | None:
        """(completed passes, rows of the pass read) when the last of the first `consumed` documents came out of the
        reader; None if none. Skipping that many rows of the first pass skips every document used."""
        if consumed == 0:
            return None
        batch = self._batch_of(consumed - 1)
        return batch.marks[consumed - 1 - batch.first]

    def _batch_of(self, index: int) -> _Batch:
        batches = [*self._done, *([self._current] if self._current else []), *self._pending]
        for batch in batches:
            if index in batch:
                return batch
        raise RuntimeError(f"document {index} is no longer tracked (handed out: {self.handed_out})")

    def _top_up(self) -> None:
        while not self._dry and len(self._pending) < self._in_flight:
            batch = self._read_batch()
            if batch is None:
                self._dry = True
            else:
                self._pending.append(batch)

    def close(self) -> None:
        """Stops the read-ahead thread (if any); the documents handed out and the positions stay valid."""
        if self._ahead is not None:
            self._ahead.close()

    def _raw_batches(self) -> Iterator[tuple[dict[str, Any], list[str], list[tuple[int, int]], list[int],
                                             dict[str, Any]]]:
        """(reader position before, texts, marks, start tokens, reader position after) per batch, until the source
        is dry."""
        while True:
            start = self.reader.state()
            texts: list[str] = []
            marks: list[tuple[int, int]] = []
            starts: list[int] = []
            chars = 0
            for text, rows_read in self._texts:
                texts.append(text)
                marks.append((self.reader.passes, rows_read))
                starts.append(self.reader.start_token)
                chars += len(text)
                # a batch ends with its pass too, so that a small restarted source is not read passes ahead
                if len(texts) >= self._max_docs or chars >= self._max_chars or self.reader.passes != start["passes"]:
                    break
            if not texts:
                return
            yield start, texts, marks, starts, self.reader.state()

    def _read_batch(self) -> _Batch | None:
        """Takes the next batch of texts (read here, or by the read-ahead thread) and submits it; None once the
        source is dry."""
        while True:
            item = next(self._raw, None)
            if item is None:
                return None
            start, texts, marks, starts, self._end_state = item
            dropped = min(self._skip, len(texts))
            self._skip -= dropped
            if dropped < len(texts):
                break
        batch = _Batch(start=start, dropped=dropped, first=self._read, marks=marks[dropped:],
                       start_tokens=starts[dropped:])
        batch.result = self._submit(texts[dropped:])
        self._read += len(batch.marks)
        return batch


class _ReadAhead:
    """Runs an iterator on a daemon thread, up to `size` items ahead; its exceptions are raised to the consumer."""

    _END = object()

    def __init__(self, items: Iterator[Any], size: int) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, args=(items,), daemon=True, name="sparknet-read-ahead")
        self._thread.start()

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        kind, value = self._queue.get()
        if kind is self._END:
            self._finished = True
            if value is not None:
                raise value
            raise StopIteration
        return value

    def close(self) -> None:
        self._stop.set()

    def _run(self, items: Iterator[Any]) -> None:
        try:
            for item in items:
                if not self._put((None, item)):
                    return
        except BaseException as exc:  # handed to the consumer, which raises it as its own
            self._put((self._END, exc))
            return
        self._put((self._END, None))

    def _put(self, entry: tuple[Any, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False
