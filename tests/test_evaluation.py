"""Metrics on held-out text: bits per byte count the bytes of the text exactly, however blocks cut it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from sparknet.model.metrics import bits_per_byte, bytes_of_tokens, token_byte_lengths


def test_bytes_are_exact_when_blocks_cut_multibyte_characters(tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    text = "日本語のテキスト、Ελληνικά κείμενα και русский текст. 😀 " * 40
    ids = np.array(tok.encode(text, add_special_tokens=False) + [tok.eos_token_id])
    n = len(ids) // 7 * 7
    blocks = ids[:n].reshape(-1, 7)  # 7-token blocks cut through multi-byte characters
    expected = len(tok.decode(ids[:n].tolist(), skip_special_tokens=True).encode("utf-8"))
    cut_decoding = sum(len(tok.decode(b.tolist(), skip_special_tokens=True).encode("utf-8")) for b in blocks)
    assert cut_decoding > expected  # decoding block by block adds replacement characters
    assert bytes_of_tokens(tok, blocks) == expected
    assert bytes_of_tokens(tok, ids[:-1]) == len(text.encode("utf-8"))
    assert token_byte_lengths(tok)[tok.eos_token_id] == 0  # special tokens stand for no text


def test_bits_per_byte_arithmetic() -> None:
    assert bits_per_byte(math.log(2), tokens=100, n_bytes=100) == 1.0
    assert bits_per_byte(2 * math.log(2), tokens=100, n_bytes=400) == 0.5
