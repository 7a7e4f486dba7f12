"""What one source hands the mixer: its encoded documents in pieces, and none that the validation split already holds.

- **Pieces.** The mixer takes whole items, so a source's share can be off by up to half an item in any prefix: one
  20 MB document asked at 0.5 gave shares of 94.8% / 5.2%. A document is therefore handed out in pieces of at most
  `piece_tokens` tokens (PIECE_BLOCKS blocks; a shorter document is one piece, itself), and every prefix carries the
  mix to within half a piece per source, whatever the document lengths. A piece holds only the document's own
  tokens: nothing is added where it is cut. The packer (data/blocks.py) ends a piece that does not end its document
  where a block ends and gives the rest back (`give_back`), so that the document is never followed inside a block by
  another one without its <|endoftext|>, and the next piece starts a new block: blocks never attend across each
  other, so the model sees a long document as it sees one that spans blocks.
- **The hold-out's share of a document.** In the validation part a document gives at most its source's `cap`
  tokens (its first ones; data/spec.py `document_caps`), so that a short validation split still holds ~20 items of
  each source, rounded to end with a block (`extend`: past the cap by less than a block where the cap ends before
  the block does); the rest of it is training's (`cut`: where the hold-out stopped in each document it did not take
  whole, which data/holdout.py hands to training as `HeldOutRows.rests`).
- **No validation text in training.** In the training part, documents whose tokens hash (BLAKE2b, 8 bytes) to one
  of `exclude` (the hold-out's documents) are dropped and counted (`removed`): a copied document in another file or
  source, a repeated boilerplate page, never reaches the training split verbatim. The rest of a document the
  hold-out cut is not whole, so it is never dropped.

The position of a piece is its document's (EncodedDocuments') plus the token of the document it starts at;
hand-written because the pieces and their positions are this pipeline's own.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparknet.data.encoding.read_ahead import EncodedDocuments


def document_hash(doc: np.ndarray) -> str:
    """A document's identity for the cross-split check: its tokens (eos included) hashed, 16 hex digits. Tokens,
    not text, so that pre-tokenized sources are covered too (the same text gives the same tokens)."""
    return hashlib.blake2b(np.ascontiguousarray(doc).tobytes(), digest_size=8).hexdigest()


@dataclass
class _Handed:
    """One document's pieces handed out: items `first`.. of the source's count, starting at the tokens `starts`."""

    first: int  # index of its first handed-out piece among all items handed out
    doc: int  # the document's index among the documents EncodedDocuments handed out
    length: int  # its tokens
    removed_before: int  # documents excluded before it
    starts: list[int] = field(default_factory=list)  # the token each of its pieces handed out starts at
    stop: int = 0  # the token after the last piece handed out (after what was given back)
    hash: str = ""  # the validation part: its document_hash


class SourcePieces:
    """Iterate for the pieces of one source (see the module docstring); `continues` says whether the last piece
    handed out ends before its document does. `offset` tokens of the first document and `removed` are a restored
    position's; `cap`: the validation part's most tokens of one document (None: training)."""

    def __init__(self, documents: EncodedDocuments, *, piece_tokens: int, cap: int | None = None,
                 exclude: frozenset[str] | set[str] = frozenset(), offset: int = 0, removed: int = 0) -> None:
        self.documents = documents
        self.reader = documents.reader
        self.piece_tokens = piece_tokens
        self.cap = cap
        self.exclude = exclude
        self.removed = removed  # documents excluded so far (before the position, when restored)
        self.handed_out = 0  # items handed out
        self.continues = False
        self._skip_tokens = offset
        self._history: deque[_Handed] = deque(maxlen=1 << 14)
        self._doc_index = documents.handed_out  # index of the next document to take from `documents`
        self._doc: np.ndarray | None = None
        self._at = self._end = 0

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        while self._doc is None or self._at >= self._end:
            self._doc = None
            doc = next(self.documents)  # StopIteration: the source is dry
            index, start = self._doc_index, self._skip_tokens
            self._doc_index, self._skip_tokens = self._doc_index + 1, 0
            if self.cap is None and self.exclude and document_hash(doc) in self.exclude:
                self.removed += 1
                continue
            self._doc, self._at = doc, start
            self._end = len(doc) if self.cap is None else min(len(doc), self.cap)
            if self._at < self._end:  # (the rest of a document may be empty: the data changed)
                self._history.append(_Handed(self.handed_out, index, len(doc), self.removed,
                                             hash=document_hash(doc) if self.cap is not None else ""))
        assert self._doc is not None
        piece = self._doc[self._at: min(self._at + self.piece_tokens, self._end)]
        entry = self._history[-1]
        entry.starts.append(self._at)
        self._at += len(piece)
        entry.stop = self._at
        self.continues = self._at < len(self._doc)
        self.handed_out += 1
        return piece

    def extend(self, tokens: int) -> np.ndarray:
        """Up to `tokens` more of the last piece's document, past its cap: a validation piece cut at its cap ends
        with its block (as every piece that does not end its document does) even where the cap falls short of it."""
        assert self._doc is not None
        more = self._doc[self._at: self._at + tokens]
        self._at += len(more)
        self._end = max(self._end, self._at)
        self._history[-1].stop = self._at
        self.continues = self._at < len(self._doc)
        return more

    def give_back(self, tokens: int) -> None:
        """The last `tokens` tokens of the last piece handed out were not used: the next piece starts with them."""
        self._at -= tokens
        self._history[-1].stop = self._at
        self.continues = True

    def position(self, consumed: int) -> dict[str, Any]:
        """The position of item `consumed` (the first handed out that is not used): its document's position in
        EncodedDocuments' terms, plus the token it starts at and the documents excluded before it."""
        if consumed < self.handed_out:
            entry = self._entry(consumed)
            doc, offset, removed = entry.doc, entry.starts[consumed - entry.first], entry.removed_before
        elif self._doc is not None and self._at < self._end:
            entry = self._history[-1]
            doc, offset, removed = entry.doc, self._at, entry.removed_before
        else:
            doc, offset, removed = self._doc_index, self._skip_tokens, self.removed
        return {**self.documents.position(doc), "offset": int(offset), "removed": int(removed)}

    def mark(self, consumed: int) -> tuple[int, int] | None:
        """EncodedDocuments' mark of the document of the last of the first `consumed` items (None if none)."""
        if consumed == 0:
            return None
        return self.documents.mark(self._entry(consumed - 1).doc + 1)

    def used_documents(self, consumed: int, partial: int = 0) -> list[tuple[str, tuple[int, int], int, int]]:
        """The validation part: each document with tokens among its first `consumed` items and `partial` tokens of
        the next one: its hash, its mark (passes, rows read when it came out), the token after its last token used
        (where the rest, training's, starts) and its length."""
        out = []
        for entry in self._history:
            used = min(len(entry.starts), max(0, consumed - entry.first))
            if used < len(entry.starts):
                stop = entry.starts[used] + (partial if entry.first + used == consumed else 0)
            else:
                stop = entry.stop
            if stop > entry.starts[0]:
                mark = self.documents.mark(entry.doc + 1)
                assert mark is not None
                out.append((entry.hash, mark, stop, entry.length))
        return out

    def _entry(self, index: int) -> _Handed:
        for entry in reversed(self._history):
            if entry.first <= index < entry.first + len(entry.starts):
                return entry
        raise RuntimeError(f"item {index} of the source is no longer tracked (handed out: {self.handed_out})")

    def close(self) -> None:
        self.documents.close()
