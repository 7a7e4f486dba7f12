"""The tagged-document oracle itself (tests/helpers.py): `tagged_documents` and `tagged_owners` read back who owns
each token of blocks packed by hand, pieces and a hold-out's rest included; `held_out_rests` gives the rest of a cut
document; `assert_every_prefix_mixed` accepts a mixed sequence and rejects ones broken by hand. The tests of the
mix at the edges of the data (test_document_edges.py, test_phases.py, test_stream.py) trust these answers.

Tokens here are characters (a token's id is its code point; 0 is <|endoftext|>, decoded to nothing, as with
`skip_special_tokens`), so that a block is written as a string."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sparknet.data.spec import HeldOutRows
from tests.helpers import assert_every_prefix_mixed, held_out_rests, tagged_documents, tagged_owners

BLOCK = 16
EOS = "\0"


def _decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids if i)


def _encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def _tag(text: str) -> str | None:
    return match.group(0) if (match := re.match(r"[ab]\d{5}", text)) else None


REST = "the rest of row 0, which the hold-out began" + EOS  # of "a00000 the rest ...", cut at token 7

# Blocks packed by hand, each part (owner's tag, its tokens): a document cut inside its tag by a block's end
# (b00002), one handed out in two pieces, the first ending with its block, the second after another document
# (a00003), one whose tag ends exactly at a block's end (b00005), and the rest of a document that the validation
# split began (a00000), untagged, first.
BLOCKS = [
    [("a00000", REST[:16])],
    [("a00000", REST[16:32])],
    [("a00000", REST[32:]), ("a00001", "a000")],
    [("a00001", "01 one two" + EOS), ("b00002", "b0000")],
    [("b00002", "2 three" + EOS), ("a00003", "a00003 l")],
    [("a00003", "ong long long lo")],
    [("b00004", "b00004 fo" + EOS), ("b00005", "b00005")],
    [("b00005", " five" + EOS), ("a00003", "ng end" + EOS), ("a00006", "a00")],
    [("a00006", "006 six seven ei")],
]


def _packed() -> tuple[np.ndarray, list[str]]:
    """The blocks' tokens (flat) and each token's owner by hand."""
    tokens, owners = [], []
    for parts in BLOCKS:
        text = "".join(part for _, part in parts)
        assert len(text) == BLOCK, (parts, len(text))
        tokens += _encode(text)
        owners += [tag for tag, part in parts for _ in part]
    return np.array(tokens, dtype=np.int64), owners


def test_documents_are_read_back_as_they_were_packed() -> None:
    tokens, owners = _packed()
    index, docs = tagged_documents(tokens, BLOCK, 0, _decode, _tag, {"a00000": _decode(_encode(REST))})
    assert [docs[i]["tag"] for i in index] == owners  # every token's owner, as packed
    by_tag = {doc["tag"]: doc for doc in docs}
    assert list(by_tag) == ["a00000", "a00001", "b00002", "a00003", "b00004", "b00005", "a00006"]
    assert by_tag["a00000"]["rest"] and by_tag["a00000"]["text"] == REST.rstrip(EOS)
    assert not any(doc["rest"] for tag, doc in by_tag.items() if tag != "a00000")
    assert by_tag["a00003"]["pieces"] == 2 and by_tag["a00003"]["text"] == "a00003 long long long long end"
    assert by_tag["b00002"]["text"] == "b00002 three" and by_tag["b00005"]["text"] == "b00005 five"
    assert {tag: doc["tokens"] for tag, doc in by_tag.items()} == {tag: owners.count(tag) for tag in by_tag}
    # by source, as the mix tests read it; the same tokens as blocks give the same owners, shaped as blocks
    sources = tagged_owners(tokens, 0, _decode, {"a": 1, "b": 0}, block_size=BLOCK,
                            rests={"a00000": _decode(_encode(REST))})
    assert sources.tolist() == [int(tag[0] == "a") for tag in owners]
    assert tagged_owners(tokens.reshape(-1, BLOCK), 0, _decode, {"a": 1, "b": 0},
                         rests={"a00000": _decode(_encode(REST))}).reshape(-1).tolist() == sources.tolist()


def test_a_rest_it_is_not_told_of_has_no_owner() -> None:
    """The rest of a document begun before the tokens, untagged and not among the `rests`: its owner is unknown
    (-1, `untagged`), not guessed; the documents after it are read as before."""
    tokens, owners = _packed()
    index, docs = tagged_documents(tokens, BLOCK, 0, _decode, _tag)
    rest = [tag == "a00000" for tag in owners]
    assert (index[rest] == -1).all() and (index[np.logical_not(rest)] >= 0).all()
    assert [docs[i]["tag"] for i, known in zip(index, rest, strict=True) if not known] == \
        [tag for tag in owners if tag != "a00000"]
    assert (tagged_owners(tokens, 0, _decode, {"a": 1, "b": 0}, untagged=7, block_size=BLOCK)[rest] == 7).all()


def test_held_out_rests_are_the_text_after_the_cut() -> None:
    texts = {"a": ["a00000 " + REST.rstrip(EOS), "a00001 one two"], "b": ["b00000 zero"]}
    expected = {"a00000": REST.rstrip(EOS)}
    held = {"a": HeldOutRows(rows=2, rests={0: 7}), "b": HeldOutRows(rows=1)}
    assert held_out_rests(held, texts, _encode, _decode) == expected
    # as a dataset's position.json records them
    assert held_out_rests({label: rows.to_dict() for label, rows in held.items()}, texts, _encode, _decode) == expected


def _owner(per_block: list[float]) -> np.ndarray:
    """Per token (blocks of BLOCK), 1 for source a and 0 for b: `per_block` gives each block's share of a, in
    sixteenths."""
    return np.concatenate([np.arange(BLOCK) < round(share * BLOCK) for share in per_block]).astype(np.int64)


def test_every_prefix_mixed_accepts_a_mixed_sequence_and_rejects_broken_ones() -> None:
    mixed = [1.0, 0.0] * 50  # a's and b's blocks in turn: every prefix within 1/64 of a half from 32 blocks on
    assert_every_prefix_mixed(_owner(mixed), 0.5, BLOCK, whole_within=0.02)
    # the first blocks are free: one source's piece of 8 blocks first is no fault
    assert_every_prefix_mixed(_owner([1.0] * 8 + [0.0] * 8 + mixed), 0.5, BLOCK, whole_within=0.02)
    # broken by hand: one source's blocks first, then the other's; the whole is a half, the prefixes are not
    with pytest.raises(AssertionError, match="a prefix's share of source a is 0.5±0.500"):
        assert_every_prefix_mixed(_owner([1.0] * 50 + [0.0] * 50), 0.5, BLOCK, whole_within=0.02)
    # a whole 2.5 points off: prefixes within 12 points, the whole accepted within 3 points and refused within 2
    off = [1.0, 0.0] * 30 + [0.5625] * 40
    assert _owner(off).mean() == pytest.approx(0.525)
    assert_every_prefix_mixed(_owner(off), 0.5, BLOCK, whole_within=0.03)
    with pytest.raises(AssertionError, match="whole's share of source a is 0.5250, not 0.5"):
        assert_every_prefix_mixed(_owner(off), 0.5, BLOCK, whole_within=0.02)
    # and the prefix tolerance and where it starts are the caller's
    with pytest.raises(AssertionError, match="a prefix's share"):
        assert_every_prefix_mixed(_owner(off), 0.5, BLOCK, whole_within=0.03, prefix_within=0.02)
    with pytest.raises(AssertionError, match="a prefix's share"):
        assert_every_prefix_mixed(_owner([1.0] * 8 + [0.0] * 8 + mixed), 0.5, BLOCK, whole_within=0.02, skip=8)
