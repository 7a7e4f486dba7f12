"""Encoding documents (no special tokens, `<|endoftext|>` appended) and cutting the token stream into fixed blocks.

Shared by the static build and the stream. Packing is written by hand (numpy) because the HF route, a batched
`datasets.map` that concatenates and re-splits, can neither track which source each token came from nor stop at an
exact token budget.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A token's source as an index into the mix's labels: uint16, so that no mix is too large for it (the ids are
# kept for validation tokens only, a few MB at most)
SOURCE_ID_DTYPE = np.dtype("<u2")
PIECE_CHARS = 1 << 20  # characters: longer documents are encoded in pieces of about this size
CUT_WINDOW = 1 << 16  # characters searched after a piece's end for a space to cut at


class DocumentEncoder:
    """Encodes batches of documents to one flat token array with eos after every document, plus document lengths.
    A document is a text, or the token ids of a pre-tokenized source, taken as they are (a trailing eos of theirs
    is not doubled).

    Built from the tokenizer's JSON so that worker processes can rebuild it cheaply. Special-token text inside a
    document (a literal "<|endoftext|>") is encoded as plain text: only the appended eos separates documents.
    """

    def __init__(self, tokenizer_json: str, eos_id: int, dtype: str | np.dtype) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.tokenizer.encode_special_tokens = True
        self.eos_id = eos_id
        self.dtype = np.dtype(dtype)

    def __call__(self, texts: Sequence[str | list[int]]) -> tuple[np.ndarray, np.ndarray]:
        if all(isinstance(t, str) and len(t) <= PIECE_CHARS for t in texts):  # the usual batch: encoded at once
            ids = [e.ids for e in self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)]
        else:
            ids = [self._encode_long(t) if isinstance(t, str) and len(t) > PIECE_CHARS
                   else (t[:-1] if t[-1] == self.eos_id else t) if not isinstance(t, str) else None for t in texts]
            short = [t for t, i in zip(texts, ids, strict=True) if i is None]
            encoded = iter(self.tokenizer.encode_batch_fast(short, add_special_tokens=False))
            ids = [next(encoded).ids if i is None else i for i in ids]
        lengths = np.fromiter((len(i) + 1 for i in ids), dtype=np.int64, count=len(ids))
        flat = np.empty(int(lengths.sum()), dtype=self.dtype)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        for doc, start, end in zip(ids, starts, ends, strict=True):
            flat[start : end - 1] = doc
        flat[ends - 1] = self.eos_id
        return flat, lengths

    def _encode_long(self, text: str) -> np.ndarray:
        """A document longer than PIECE_CHARS, encoded in pieces so that memory stays bounded (one 50 MB line took
        6.5 GB encoded whole). Pieces are cut before a single space between two non-space characters, where the
        byte-level pre-tokenizer starts a new word anyway, so the tokens equal those of the whole; a piece with no
        such space in reach (a blob without spaces) is cut where it is, which may change the tokens at that cut."""
        pieces, start = [], 0
        while len(text) - start > PIECE_CHARS:
            cut = start + PIECE_CHARS
            window = text[cut: cut + CUT_WINDOW]
            offset = next((i for i in range(1, len(window) - 1) if window[i] == " " and not window[i - 1].isspace()
                           and not window[i + 1].isspace()), None)
            cut = cut + offset if offset is not None else cut
            pieces.append(text[start:cut])
            start = cut
        pieces.append(text[start:])
        parts = [np.asarray(e.ids, dtype=np.int64) for e in self.tokenizer.encode_batch_fast(pieces,
                                                                                              add_special_tokens=False)]
        return np.concatenate(parts)


@dataclass
class BlockPacker:
    """Appends documents and hands out full blocks of `block_size` tokens, crediting each token to its source.

    Documents are concatenated as they come (each already ends with eos); nothing is padded. Blocks are handed out
    when taken; a token is credited to its source when its block is taken, and the final partial block is dropped
    and credited to no one.
    """

    block_size: int
    dtype: np.dtype
    tokens_by_source: Counter[str] = field(default_factory=Counter)  # tokens in handed-out blocks
    documents_by_source: Counter[str] = field(default_factory=Counter)  # documents started in this packer
    blocks: int = 0

    def __post_init__(self) -> None:
        self._pending: list[np.ndarray] = []
        self._segments: deque[list[Any]] = deque()  # [label, tokens not yet in a handed-out block], in order
        self.pending_tokens = 0
        # with `record_sources`: the source index of every token handed out, as runs [index, tokens] (a validation
        # split's per-token source ids, for the loss per source; a few runs per document, kept in the state)
        self._source_index: dict[str, int] | None = None
        self.source_runs: list[list[int]] = []
        # ... and where each item (a document, or a piece of one) starts among those tokens: a piece of a long
        # document, or a validation document cut at its cap, ends where a block ends with no <|endoftext|>, so the
        # tokens alone cannot say where documents start (evaluation reads this record)
        self.item_starts: list[int] = []
        self._recorded = 0  # tokens handed out since `record_sources`

    def record_sources(self, labels: Sequence[str]) -> None:
        """From now on, remembers which source (its index in `labels`) each handed-out token came from, and where
        each item handed out starts (`item_starts`)."""
        self._source_index = {label: index for index, label in enumerate(labels)}

    def source_ids(self) -> np.ndarray:
        """The source index of every token handed out since `record_sources`, in order (SOURCE_ID_DTYPE)."""
        runs = np.asarray(self.source_runs, dtype=np.int64).reshape(-1, 2)
        return np.repeat(runs[:, 0], runs[:, 1]).astype(SOURCE_ID_DTYPE)

    @property
    def tokens_added(self) -> int:
        """Tokens handed out in blocks plus those still pending."""
        return self.blocks * self.block_size + self.pending_tokens

    def add(self, label: str, tokens: np.ndarray) -> None:
        """Appends one document (or piece of one) to the pending tokens."""
        self._pending.append(tokens)
        self._segments.append([label, len(tokens), len(tokens)])  # label, tokens not handed out, length
        self.pending_tokens += len(tokens)
        self.documents_by_source[label] += 1

    def take(self, n_blocks: int) -> np.ndarray:
        """Up to `n_blocks` full blocks now (fewer when fewer are pending), for a caller that hands blocks out one
        at a time: every token is credited to its source when its block is taken."""
        return self._take(min(n_blocks, self.pending_tokens // self.block_size))

    def drop_rest(self) -> None:
        """Drops the pending tokens (less than a block once the full ones are taken), credited to no one."""
        self._pending, self._segments, self.pending_tokens = [], deque(), 0

    def _take(self, n_blocks: int) -> np.ndarray:
        if n_blocks == 0:
            return np.empty((0, self.block_size), dtype=self.dtype)
        n_tokens = n_blocks * self.block_size
        flat = np.concatenate(self._pending) if len(self._pending) != 1 else self._pending[0]
        out, rest = flat[:n_tokens], flat[n_tokens:]
        self._pending = [rest] if len(rest) else []
        self.pending_tokens = len(rest)
        self.blocks += n_blocks
        remaining = n_tokens
        while remaining and self._segments:
            seg = self._segments[0]
            used = min(seg[1], remaining)
            self.tokens_by_source[seg[0]] += used
            if self._source_index is not None:
                if seg[1] == seg[2]:  # the item's first token handed out
                    self.item_starts.append(self._recorded + n_tokens - remaining)
                index = self._source_index[seg[0]]
                if self.source_runs and self.source_runs[-1][0] == index:
                    self.source_runs[-1][1] += used
                else:
                    self.source_runs.append([index, used])
            seg[1] -= used
            remaining -= used
            if seg[1] == 0:
                self._segments.popleft()
        if self._source_index is not None:
            self._recorded += n_tokens
        return out.reshape(n_blocks, self.block_size)
