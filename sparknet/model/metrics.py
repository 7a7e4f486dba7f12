"""Metrics of a loss on held-out text: perplexity, bits per byte (comparable across tokenizers), unigram entropy.

Bits per byte turn a per-token loss into a per-byte one, `loss / ln 2 × tokens / bytes`, so that models with
different tokenizers compare on the same text.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def perplexity(loss: float) -> float:
    """exp(loss), kept finite for display (inf only when the loss itself is)."""
    if not math.isfinite(loss):
        return float("inf")
    return math.exp(min(loss, 700.0))


def token_byte_lengths(tokenizer: Any) -> np.ndarray:
    """UTF-8 bytes each token id stands for (special tokens: 0), so that the bytes of any token sequence are a sum.

    Exact for byte-level BPE (GPT-2 style: each character of a token is one byte), whatever the block boundaries
    cut: decoding a block that starts inside a multi-byte character would add replacement characters instead.
    Other tokenizers fall back to decoding each token alone.
    """
    from tokenizers import decoders

    backend = tokenizer.backend_tokenizer
    special = set(tokenizer.all_special_ids)
    vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    lengths = np.zeros(len(vocab), dtype=np.int64)
    byte_level = isinstance(backend.decoder, decoders.ByteLevel)
    for token_id, token in enumerate(vocab):
        if token_id in special or token is None:
            continue
        if byte_level:
            lengths[token_id] = len(token)  # one character of the byte-level alphabet per byte
        else:
            lengths[token_id] = len(tokenizer.decode([token_id]).encode("utf-8"))
    return lengths


def bytes_of_tokens(tokenizer: Any, tokens: np.ndarray) -> int:
    """UTF-8 bytes of the text the tokens stand for, counted per token id (special tokens count as none)."""
    lengths = token_byte_lengths(tokenizer)
    return int(lengths[np.asarray(tokens).reshape(-1).astype(np.int64)].sum())


def tokens_and_bytes_by_source(tokenizer: Any, tokens: np.ndarray, sources: np.ndarray,
                               labels: list[str]) -> dict[str, tuple[int, int]]:
    """Per source label: how many of `tokens` it has and the UTF-8 bytes they stand for (`sources`: each token's
    index into `labels`, the same shape as `tokens`), for bits per byte per source."""
    ids = np.asarray(sources).reshape(-1).astype(np.int64)
    lengths = token_byte_lengths(tokenizer)[np.asarray(tokens).reshape(-1).astype(np.int64)]
    counts = np.bincount(ids, minlength=len(labels))
    n_bytes = np.bincount(ids, weights=lengths, minlength=len(labels))
    return {label: (int(counts[i]), int(n_bytes[i])) for i, label in enumerate(labels)}


def bits_per_byte(loss: float, tokens: int, n_bytes: int) -> float:
    """Mean loss in nats per token turned into bits per UTF-8 byte."""
    return loss / math.log(2) * tokens / max(n_bytes, 1)


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Entropy (nats per token) of the token frequencies: the loss of the best model that ignores context."""
    counts = np.bincount(np.asarray(tokens).reshape(-1), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
