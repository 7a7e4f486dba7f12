"""Mixing sources: proportional by documents or tokens, interleaved from the start, exhausted sources handled."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from sparknet.config.mix import load_config
from sparknet.data.mixing import Mixer, mix_texts
from tests.helpers import write_config, write_jsonl


def _two_sources(tmp_path: Path, n_short: int = 3000, n_long: int = 800) -> tuple[Path, Path]:
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    short = [" ".join(rng.choices(words, k=rng.randint(2, 6))) for _ in range(n_short)]  # ~30 bytes
    long = [" ".join(rng.choices(words, k=rng.randint(600, 1200))) for _ in range(n_long)]  # ~5 kB
    return write_jsonl(tmp_path / "short.jsonl", short), write_jsonl(tmp_path / "long.jsonl", long)


def test_every_prefix_carries_the_mix(tmp_path: Path) -> None:
    """Document by document across sources: no source is drained before the next starts."""
    short, long = _two_sources(tmp_path, 500, 500)
    cfg = load_config(
        write_config(
            tmp_path / "mix.json",
            [
                {"name": "json", "prob": 0.8, "data_files": str(short)},
                {"name": "json", "prob": 0.2, "data_files": str(long)},
            ],
        )
    )
    labels = [label for label, _text in itertools.islice(mix_texts(cfg), 400)]
    for n in (5, 10, 50, 100, 400):
        assert abs(labels[:n].count("long") - 0.2 * n) <= 1


def test_token_mixing_tracks_units_within_one_document() -> None:
    rng = random.Random(1)
    streams = {
        "a": [[0] * rng.randint(1, 2000) for _ in range(3000)],
        "b": [[0] * rng.randint(1, 50) for _ in range(30000)],
    }
    mixer = Mixer(streams, {"a": 0.5, "b": 0.5}, cost=len)
    taken = 0
    for _label, doc in mixer:
        taken += len(doc)
        if taken > 1_000_000:
            break
    units = {k: c.units for k, c in mixer.counts.items()}
    assert abs(units["a"] - units["b"]) <= 2000  # never more than one (longest) document apart
    report = mixer.report()
    assert abs(report["a"]["share"] - 0.5) < 0.001 and report["a"]["requested_share"] == 0.5


def test_exhausted_source_is_recorded_and_the_others_go_on() -> None:
    mixer = Mixer({"small": iter(range(10)), "big": iter(range(1000))}, {"small": 0.5, "big": 0.5})
    out = list(mixer)
    assert len(out) == 1010
    assert [label for label, _ in out[:20]].count("small") == 10
    assert mixer.counts["small"].exhausted and mixer.counts["big"].exhausted
    assert mixer.report()["small"]["documents"] == 10


def test_new_probs_restart_the_shares_and_a_source_at_zero_is_not_read() -> None:
    """A phase boundary (`set_probs`): every prefix after it carries the new mix on its own, whatever came before; a
    source left out is not read (its reader goes on where it was when a later phase asks for it again)."""
    read = {"a": 0, "b": 0}

    def stream(label: str):
        for i in itertools.count():
            read[label] = i + 1
            yield i

    mixer = Mixer({"a": stream("a"), "b": stream("b")}, {"a": 0.5, "b": 0.5})
    mixed = iter(mixer)
    assert [label for label, _ in itertools.islice(mixed, 100)].count("a") == 50
    mixer.set_probs({"b": 1.0})
    a_read = read["a"]
    assert {label for label, _ in itertools.islice(mixed, 50)} == {"b"} and read["a"] == a_read
    mixer.set_probs({"a": 0.25, "b": 0.75})
    after = [label for label, _ in itertools.islice(mixed, 400)]
    for n in range(8, 401):  # from the boundary on, not skewed toward a by b's 50 documents before
        assert abs(after[:n].count("a") - 0.25 * n) <= 1, n
    assert mixer.report()["a"]["requested_share"] == 0.25


def test_held_out_documents_follow_the_sample_and_are_not_counted() -> None:
    mixer = Mixer({"a": iter(range(100)), "b": iter(range(100, 200))}, {"a": 0.5, "b": 0.5})
    sample = [item for _, item in itertools.islice(mixer, 10)]
    held = mixer.held_out(3)
    assert held == {"a": [5, 6, 7], "b": [105, 106, 107]}
    assert not set(sample) & set(held["a"] + held["b"])
    assert mixer.total_units == 10


def _long_and_short(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Token-count stand-ins: ~1,300-token documents against ~140-token ones (the issue's case)."""
    rng = random.Random(seed)
    return ([[0] * rng.randint(900, 1700) for _ in range(300)], [[0] * rng.randint(60, 220) for _ in range(12000)])


def test_every_prefix_errs_symmetrically_around_the_share() -> None:
    """The midpoint rule: the long-document source is ahead of its share about as often as behind (the old rule
    `(units + next) / prob` kept it behind at every prefix, so a short validation split could miss it)."""
    long, short = _long_and_short()
    mixer = Mixer({"long": long, "short": short}, {"long": 0.2, "short": 0.8}, cost=len)
    total = long_tokens = long_docs = 0
    errors = []
    for label, doc in mixer:
        total += len(doc)
        if label == "long":
            long_tokens += len(doc)
            long_docs += 1
        errors.append(long_tokens / total - 0.2)
        if long_docs == 100:
            break
    settled = errors[len(errors) // 10:]
    above = sum(e > 0 for e in settled) / len(settled)
    assert 0.3 < above < 0.7, above
    assert abs(sum(settled) / len(settled)) < 0.001


def test_a_validation_sized_prefix_carries_the_mix_within_two_points() -> None:
    """The first VAL_TOKENS of the stream (whole blocks, cut anywhere) hold each source within ±2 points once they
    hold ~20 documents of each."""
    long, short = _long_and_short(1)
    for val_tokens in (4_096, 130_000, 200_000, 262_144):
        mixer = Mixer({"long": long, "short": short}, {"long": 0.2, "short": 0.8}, cost=len)
        taken = {"long": 0, "short": 0}
        docs = {"long": 0, "short": 0}
        for label, doc in mixer:
            take = min(len(doc), val_tokens - sum(taken.values()))
            taken[label] += take
            docs[label] += 1
            if sum(taken.values()) >= val_tokens:
                break
        if min(docs.values()) >= 20:
            assert abs(taken["long"] / val_tokens - 0.2) <= 0.02, (val_tokens, taken)
        else:  # too short for 20 long documents: the long source is still in it, not left out
            assert taken["long"] > 0, (val_tokens, taken)


def test_a_huge_document_is_encoded_in_pieces_with_the_same_tokens(tokenizer_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    import numpy as np
    from tokenizers import Tokenizer

    from sparknet.data.encoding import packer

    tokenizer_json = (tokenizer_dir / "tokenizer.json").read_text()
    whole = Tokenizer.from_str(tokenizer_json)
    whole.encode_special_tokens = True
    rng = random.Random(0)
    words = "the quick brown fox jumps over a lazy dog, while 42 rivers (of stone) carry   light\n".split(" ")
    huge = " ".join(rng.choice(words) for _ in range(40_000))  # ~200 kB on one line, runs of spaces and newlines
    ordinary = ["a short document", "another one\nwith two lines"]
    monkeypatch.setattr(packer, "PIECE_CHARS", 5_000)  # pieces of 5 kB instead of 1 MB, to test it quickly
    encoder = packer.DocumentEncoder(tokenizer_json, eos_id=0, dtype="uint16")
    flat, lengths = encoder([ordinary[0], huge, ordinary[1]])
    docs = np.split(flat, np.cumsum(lengths)[:-1])
    for doc, text in zip(docs, [ordinary[0], huge, ordinary[1]], strict=True):
        assert doc[-1] == 0 and doc[:-1].tolist() == whole.encode(text, add_special_tokens=False).ids
