"""What one source hands the mixer: its encoded documents, a long one in pieces, and none that the validation split
already holds.

- **Pieces.** The mixer takes whole items, so a source's share can be off by up to half an item in any prefix: one
  20 MB document asked at 0.5 gave shares of 94.8% / 5.2%. A document longer than `piece_tokens` (PIECE_BLOCKS
  blocks: `piece_tokens_for`) is therefore handed out in pieces of at most that many tokens, each but the last with the
  first `piece_tokens - 1` tokens of what is left and an <|endoftext|> (as a validation document cut to its cap
  is), the last with the document's own end. Every prefix then carries the mix to within half a piece per source,
  whatever the document lengths. Tokens never attend across blocks, and a long document spans blocks anyway: the
  cost is one <|endoftext|> per `piece_tokens` of a long document.
- **No validation text in training.** Documents whose tokens hash (BLAKE2b, 8 bytes) to one of `exclude` (the
  validation split's documents) are dropped and counted (`removed`): a copied document in another file or source,
  a repeated boilerplate page, never reaches the training split verbatim.

While `active` is off (a validation hold-out, whose documents are cut to their caps after the mixer), documents go
out whole and nothing is excluded. The position of a piece is its document's (EncodedDocuments') plus the pieces of
that document already handed out; hand-written because the pieces and their positions are this pipeline's own.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparknet.data.encoding.read_ahead import EncodedDocuments

# Blocks per piece of a long document. Smaller pieces hold every prefix closer to the mix but put more
# <|endoftext|> into long documents; 8 blocks keep a source within 4 blocks of its share in any prefix and cut a
# document only where it already spans 8 blocks.
PIECE_BLOCKS = 8


def piece_tokens_for(block_size: int) -> int:
    """The longest item a source hands the mixer, for blocks of `block_size` tokens."""
    return PIECE_BLOCKS * block_size


def document_hash(doc: np.ndarray) -> str:
    """A document's identity for the cross-split check: its tokens (eos included) hashed, 16 hex digits. Tokens,
    not text, so that pre-tokenized sources are covered too (the same text gives the same tokens)."""
    return hashlib.blake2b(np.ascontiguousarray(doc).tobytes(), digest_size=8).hexdigest()


def split_document(doc: np.ndarray, piece_tokens: int, eos_id: int) -> list[np.ndarray]:
    """`doc` (ending with eos) as pieces of at most `piece_tokens` tokens, each ending with eos; [doc] when short."""
    if piece_tokens <= 1 or len(doc) <= piece_tokens:
        return [doc]
    step = piece_tokens - 1
    body, eos = doc[:-1], doc[-1:]
    return [np.concatenate([body[start:start + step], eos]) for start in range(0, len(body), step)]


@dataclass
class _Handed:
    """One document's pieces handed out: pieces `first`.. of the source's count, from its piece `start` on."""

    first: int  # index of its first handed-out piece among all pieces handed out
    doc: int  # the document's index among the documents EncodedDocuments handed out
    start: int  # pieces of it dropped before (a restored position) or handed out before this entry
    count: int  # pieces handed out
    removed_before: int  # documents excluded before it


class SourcePieces:
    """Iterate for the items of one source: documents, or pieces of long ones, minus excluded ones (see the module
    docstring). `piece` pieces of the first document and `removed` are a restored position's."""

    def __init__(self, documents: EncodedDocuments, *, piece_tokens: int, eos_id: int, active: bool = True,
                 exclude: set[str] | None = None, piece: int = 0, removed: int = 0) -> None:
        self.documents = documents
        self.reader = documents.reader
        self.piece_tokens = piece_tokens
        self.eos_id = eos_id
        self.active = active
        self.exclude = exclude if exclude is not None else set()
        self.removed = removed  # documents excluded so far (before the position, when restored)
        self.handed_out = 0  # items handed out
        self._skip_pieces = piece
        self._history: deque[_Handed] = deque(maxlen=1 << 14)
        self._doc_index = documents.handed_out  # index of the next document to take from `documents`
        self._current: tuple[int, list[np.ndarray], int] | None = None  # (doc index, pieces, next piece)
        self._put_back: tuple[int, np.ndarray] | None = None

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        while self._current is None or self._current[2] == len(self._current[1]):
            self._current = None
            if self._put_back is not None:
                index, doc = self._put_back
                self._put_back = None
            else:
                doc = next(self.documents)  # StopIteration: the source is dry
                index = self._doc_index
                self._doc_index += 1
            if self.active and self.exclude and document_hash(doc) in self.exclude:
                self.removed += 1
                self._skip_pieces = 0
                continue
            pieces = split_document(doc, self.piece_tokens, self.eos_id) if self.active else [doc]
            start, self._skip_pieces = min(self._skip_pieces, len(pieces)), 0
            self._current = (index, pieces, start)
            self._history.append(_Handed(self.handed_out, index, start, 0, self.removed))
        index, pieces, at = self._current
        self._current = (index, pieces, at + 1)
        self._history[-1].count += 1
        self.handed_out += 1
        return pieces[at]

    def put_back(self, item: np.ndarray) -> None:
        """Takes back the last item handed out, a whole document (handed out while not `active`), to be handed out
        again under the current rules (in pieces, or excluded) when the hold-out ends."""
        last = self._history[-1]
        assert last.count == 1 and last.start == 0 and self._current is not None
        self._history.pop()
        self.handed_out -= 1
        self._current = None
        self._put_back = (last.doc, item)

    def position(self, consumed: int) -> dict[str, Any]:
        """The position of item `consumed` (the first handed out that is not used): its document's position in
        EncodedDocuments' terms, plus the pieces of it to drop and the documents excluded before it."""
        if consumed < self.handed_out:
            entry = self._entry(consumed)
            doc, piece, removed = entry.doc, entry.start + consumed - entry.first, entry.removed_before
        elif self._current is not None and self._current[2] < len(self._current[1]):
            doc, piece, removed = self._current[0], self._current[2], self._history[-1].removed_before
        elif self._put_back is not None:
            doc, piece, removed = self._put_back[0], 0, self.removed
        else:
            doc, piece, removed = self._doc_index, self._skip_pieces, self.removed
        return {**self.documents.position(doc), "piece": piece, "removed": removed}

    def mark(self, consumed: int) -> tuple[int, int] | None:
        """EncodedDocuments' mark of the document of the last of the first `consumed` items (None if none)."""
        if consumed == 0:
            return None
        return self.documents.mark(self._entry(consumed - 1).doc + 1)

    def _entry(self, index: int) -> _Handed:
        for entry in reversed(self._history):
            if entry.first <= index < entry.first + entry.count:
                return entry
        raise RuntimeError(f"item {index} of the source is no longer tracked (handed out: {self.handed_out})")

    def close(self) -> None:
        self.documents.close()
