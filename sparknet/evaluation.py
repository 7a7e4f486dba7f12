"""Metrics on held-out text: perplexity, bits per byte (comparable across tokenizers), unigram entropy.

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


def utf8_bytes(tokenizer: Any, tokens: np.ndarray) -> int:
    """UTF-8 bytes of the text the tokens stand for, special tokens (end-of-text) counted as none."""
    flat = np.asarray(tokens).reshape(-1).tolist()
    total = 0
    step = 1 << 20  # decode in chunks; a cut multi-byte character costs at most a few bytes per million tokens
    for start in range(0, len(flat), step):
        total += len(tokenizer.decode(flat[start : start + step], skip_special_tokens=True).encode("utf-8"))
    return total


def bits_per_byte(loss: float, tokens: int, n_bytes: int) -> float:
    """Mean loss in nats per token turned into bits per UTF-8 byte."""
    return loss / math.log(2) * tokens / max(n_bytes, 1)


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Entropy (nats per token) of the token frequencies: the loss of the best model that ignores context."""
    counts = np.bincount(np.asarray(tokens).reshape(-1), minlength=vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
