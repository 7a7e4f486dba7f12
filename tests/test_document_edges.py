"""The mix at the edges of the data: one huge document anywhere in a source (first, middle, last) still gives every
prefix its share, in the packed build and in the stream; the same content under another file name is refused; no
validation document is trained on verbatim, in the build and the stream.

Every document starts with its source's tag ("a00012 ", "b00345 "); the huge one with "a-huge". The text alone
says, independently of SparkNet's own counts, which source each token came from (tests/helpers.py
`tagged_documents`): a document's pieces end with their blocks and carry no <|endoftext|> but the document's own."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from sparknet.common.errors import UserError
from sparknet.config.mix import load_config
from sparknet.data.holdout import hold_out
from sparknet.data.packed.build import BuildSpec, build_dataset
from sparknet.data.packed.dataset import PackedDataset
from sparknet.data.spec import DataSpec
from tests.helpers import (
    assert_every_prefix_mixed,
    held_out_rests,
    run_script,
    stream_of,
    tagged_documents,
    write_config,
    write_jsonl,
)

BLOCK = 64
WORDS = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud green quick "
         "brown lazy dog fox jumps over under light night").split()


def _texts(tag: str, n: int, seed: int, words: tuple[int, int] = (20, 120)) -> list[str]:
    rng = random.Random(seed)
    return [f"{tag}{i:05d} " + " ".join(rng.choices(WORDS, k=rng.randint(*words))) for i in range(n)]


HUGE = "a-huge " + " ".join(random.Random(9).choices(WORDS, k=150_000))  # ~1 MB on one line


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE saved as a tokenizer folder (what the build and the stream load)."""
    from transformers import PreTrainedTokenizerFast

    from sparknet.bpe import train_bpe
    from sparknet.tokenizer import EOT

    tok = train_bpe(_texts("a", 200, 1) + _texts("b", 200, 2), vocab_size=400)
    out = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT).save_pretrained(out)
    return out


def _tag(text: str) -> str | None:
    return match.group(0) if (match := re.match(r"a-huge|[ab]\d{5}", text)) else None


def _sources(tokens: np.ndarray, eos: int, tok: Tokenizer,
             rests: dict[str, str] | None = None) -> tuple[np.ndarray, list[dict]]:
    """Per token (flat, whole blocks), 1 for source a (its documents and the huge one) and 0 for b, and the documents
    (`tagged_documents`, with the `rests` training starts with); tokens of a document begun before `tokens` count
    as a's (the huge one's)."""
    index, docs = tagged_documents(tokens, BLOCK, eos, tok.decode, _tag, rests)
    source = np.array([int(doc["tag"].startswith("a")) for doc in docs] + [1], dtype=np.int8)
    return source[index], docs


def _encoder(tok: Tokenizer) -> Callable[[str], list[int]]:
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def _data(cfg: Path, tok: Tokenizer, **kw: object) -> DataSpec:
    return DataSpec(config=load_config(cfg), tokenizer_json=tok.to_str(), eos_id=tok.token_to_id("<|endoftext|>"),
                    block_size=BLOCK, seed=1, **kw)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_one_huge_document_anywhere_keeps_every_prefix_of_the_build_and_the_stream_on_the_mix(
        where: str, tokenizer: Path, tmp_path: Path) -> None:
    normal = _texts("a", 120, 3)  # ~14k tokens: the huge document must give the rest of a's 0.5
    write_jsonl(tmp_path / "b.jsonl", _texts("b", 1500, 4))
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")

    def config(at: int) -> Path:
        write_jsonl(tmp_path / "a.jsonl", [*normal[:at], HUGE, *normal[at:]])
        return write_config(tmp_path / "mix.json", [
            {"name": "json", "prob": 0.5, "data_files": str(tmp_path / "a.jsonl")},
            {"name": "json", "prob": 0.5, "data_files": str(tmp_path / "b.jsonl")}], context_length=BLOCK)

    # the hold-out takes a's first rows (a huge document there gives it its first tokens): "first" is the first
    # document after them (one after, so that the hold-out's choices stay those without it)
    rows = hold_out(_data(config(len(normal)), tok, val_tokens=4_000)).rows
    cfg = config({"first": rows["a"].rows + 1, "middle": 60, "last": len(normal)}[where])
    out = tmp_path / "ds"
    manifest = build_dataset(BuildSpec(config=load_config(cfg), tokenizer=str(tokenizer), output_dir=out,
                                       target_tokens=60_000, val_tokens=4_000, block_size=BLOCK, seed=1))
    tokens = np.asarray(PackedDataset(out, "train").tokens).reshape(-1)
    texts = {"a": [json.loads(line)["text"] for line in (tmp_path / "a.jsonl").read_text().splitlines()],
             "b": _texts("b", 1500, 4)}
    rests = held_out_rests(hold_out(_data(cfg, tok, val_tokens=4_000)).rows, texts, _encoder(tok), tok.decode)
    owner, docs = _sources(tokens, eos, tok, rests)
    assert_every_prefix_mixed(owner, 0.5, BLOCK, whole_within=0.02)
    assert manifest["complete"] and manifest["shares_missed"] == {}
    assert abs(manifest["splits"]["train"]["sources"]["a"]["share"] - owner.mean()) < 1e-9  # its count is ours
    # the huge document went in as pieces (8 blocks at most, each but its last ending with a block) with no eos
    huge = next(doc for doc in docs if doc["tag"] == "a-huge")
    assert huge["pieces"] > 5 and HUGE.startswith(huge["text"])
    index, _ = tagged_documents(tokens, BLOCK, eos, tok.decode, _tag, rests)
    huge_tokens = np.flatnonzero(index == docs.index(huge))
    assert not (tokens[huge_tokens[:-1]] == eos).any()  # none forged where its pieces end

    cfg = config({"first": 0, "middle": 60, "last": len(normal)}[where])  # the stream: no hold-out here
    stream = stream_of(load_config(cfg), tok.to_str(), eos, block_size=BLOCK, seed=1)
    blocks = []
    for item in stream:
        blocks.append(item["input_ids"].numpy())
        if len(blocks) == 60_000 // BLOCK:
            break
    stream.close()
    owner, _ = _sources(np.concatenate(blocks), eos, tok)
    assert_every_prefix_mixed(owner, 0.5, BLOCK, whole_within=0.02)


@pytest.mark.parametrize("where", ["build", "stream"])
def test_a_long_first_document_gives_the_hold_out_its_start_and_training_the_rest(
        where: str, tokenizer: Path, tmp_path: Path) -> None:
    """A huge document first in a source asked at 0.4: the hold-out takes its first tokens (up to the source's
    cap), training the rest, whole, in pieces; so the source keeps its share of the training split (before, the
    rest was dropped: 98% of the source lost and 20.5% / 79.5% for 40 / 60)."""
    write_jsonl(tmp_path / "a.jsonl", [HUGE, *_texts("a", 40, 3)])
    write_jsonl(tmp_path / "b.jsonl", _texts("b", 2000, 4))
    cfg = write_config(tmp_path / "mix.json", [
        {"name": "json", "prob": 0.4, "data_files": str(tmp_path / "a.jsonl")},
        {"name": "json", "prob": 0.6, "data_files": str(tmp_path / "b.jsonl")}], context_length=BLOCK)
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    held = hold_out(_data(cfg, tok, val_tokens=2_000))
    _, val_docs = _sources(held.blocks.reshape(-1), eos, tok)
    start = next(doc for doc in val_docs if doc["tag"] == "a-huge")["tokens"]
    assert held.rows["a"].rests[0] == start and start < 2_000 * 0.4 / 20 + BLOCK
    blocks = 100_000 // BLOCK
    if where == "build":
        manifest = build_dataset(BuildSpec(config=load_config(cfg), tokenizer=str(tokenizer),
                                           output_dir=tmp_path / "ds", target_tokens=blocks * BLOCK,
                                           val_tokens=2_000, block_size=BLOCK, seed=1))
        assert manifest["complete"] and not manifest["exhausted_sources"]
        tokens = np.asarray(PackedDataset(tmp_path / "ds", "train").tokens).reshape(-1)
    else:
        stream = stream_of(load_config(cfg), tok.to_str(), eos, block_size=BLOCK, seed=1, held_out=held.rows,
                           exclude=held.hashes)
        tokens = np.concatenate([item["input_ids"].numpy() for _, item in zip(range(blocks), stream, strict=False)])
        stream.close()
    rests = held_out_rests(held.rows, {"a": [HUGE, *_texts("a", 40, 3)], "b": _texts("b", 2000, 4)}, _encoder(tok),
                           tok.decode)
    owner, docs = tagged_documents(tokens, BLOCK, eos, tok.decode, _tag, rests)
    rest = rests["a-huge"]
    huge = next(doc for doc in docs if doc["rest"] and doc["tag"] == "a-huge")
    assert rest.startswith(huge["text"]) and huge["pieces"] > 5  # training starts with the rest, in pieces
    source = np.array([int(doc["tag"].startswith("a")) for doc in docs] + [-1])[owner]
    assert (source >= 0).all() and abs(source.mean() - 0.4) <= 0.02  # the source keeps its share
    for k in range(len(docs)):  # an eos only where a document ends: none forged where a piece of the rest ends
        ends = np.flatnonzero((owner == k) & (tokens == eos))
        assert len(ends) <= 1 and (not len(ends) or ends[0] == np.flatnonzero(owner == k)[-1]), docs[k]["tag"]


def test_the_same_content_under_another_name_is_refused(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", _texts("a", 30, 5))
    write_jsonl(tmp_path / "b.jsonl", _texts("b", 30, 6))
    shutil.copy(tmp_path / "a.jsonl", tmp_path / "copy.jsonl")
    os.link(tmp_path / "b.jsonl", tmp_path / "linked.jsonl")
    for other, first in (("copy.jsonl", "a.jsonl"), ("linked.jsonl", "b.jsonl")):
        cfg = write_config(tmp_path / "mix.json", [
            {"name": "json", "prob": 0.5, "data_files": str(tmp_path / "a.jsonl")},
            {"name": "json", "prob": 0.3, "data_files": str(tmp_path / "b.jsonl")},
            {"name": "json", "prob": 0.2, "data_files": str(tmp_path / other)}])
        with pytest.raises(UserError, match=rf"mix\[2\].*{other}.*same content as.*{first}.*mix\[\d\]"):
            load_config(cfg)
    # within one entry, through a glob, too
    cfg = write_config(tmp_path / "glob.json", [{"name": "json", "prob": 1.0, "data_files": str(tmp_path / "*.jsonl")}])
    with pytest.raises(UserError, match="same content"):
        load_config(cfg)
    proc = run_script("build_dataset_v5.py", "--config", cfg, "--tokenizer_dir", tmp_path / "none",
                      "--output_dir", tmp_path / "ds")
    assert proc.returncode != 0 and "same content" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _repeats_config(tmp_path: Path) -> tuple[Path, list[str], list[str]]:
    """Source a, and source b whose later rows repeat a's first documents (those the hold-out takes) and one of its
    own first ones; a also repeats its first document further on."""
    a = _texts("a", 200, 7)
    b = _texts("b", 200, 8)
    a[150] = a[0]
    b[120:140] = a[:20]
    b[160] = b[1]
    write_jsonl(tmp_path / "a.jsonl", a)
    write_jsonl(tmp_path / "b.jsonl", b)
    cfg = write_config(tmp_path / "mix.json", [
        {"name": "json", "prob": 0.5, "data_files": str(tmp_path / "a.jsonl")},
        {"name": "json", "prob": 0.5, "data_files": str(tmp_path / "b.jsonl")}], context_length=BLOCK)
    return cfg, a, b


def _whole_documents(tokens: np.ndarray, eos: int, tok: Tokenizer, known: set[str]) -> list[str]:
    """The documents of `tokens` (flat, whole blocks) that start in them, read back from their tags; one cut (by
    the hold-out's cap, or the end of the split) matched to the one document it starts."""
    _, docs = tagged_documents(tokens, BLOCK, eos, tok.decode, _tag)
    out = []
    for doc in docs:
        prefixed = [doc["text"]] if doc["text"] in known else [k for k in known if k.startswith(doc["text"])]
        assert len(set(prefixed)) == 1, doc["text"][:40]
        out.append(prefixed[0])
    return out


def test_no_validation_document_is_trained_on_in_the_build_or_the_stream(tokenizer: Path, tmp_path: Path) -> None:
    cfg, a, b = _repeats_config(tmp_path)
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    known = set(a) | set(b)

    out = tmp_path / "ds"
    manifest = build_dataset(BuildSpec(config=load_config(cfg), tokenizer=str(tokenizer), output_dir=out,
                                       target_tokens=10**6, val_tokens=3_000, block_size=BLOCK, seed=1))
    val = set(_whole_documents(np.asarray(PackedDataset(out, "val").tokens).reshape(-1), eos, tok, known))
    train = _whole_documents(np.asarray(PackedDataset(out, "train").tokens).reshape(-1), eos, tok, known)
    assert a[0] in val and not val & set(train)
    # every source read whole (a budget larger than the data), the validation split from each one's first rows: the
    # documents removed are exactly the later rows that repeat a validation document
    for label, texts in (("a", a), ("b", b)):
        held_out = sum(1 for t in val if t.startswith(label))  # the copies sit in later rows
        expected = sum(1 for t in texts[held_out:] if t in val)
        got = manifest["splits"]["train"]["sources"][label]["validation_repeats_removed"]
        assert got == expected and got > 0, (label, got, expected)

    held = hold_out(_data(cfg, tok, val_tokens=3_000))
    val = set(_whole_documents(held.blocks.reshape(-1), eos, tok, known))
    assert held.hashes and len(held.hashes) >= len(val)
    stream = stream_of(load_config(cfg), tok.to_str(), eos, block_size=BLOCK, seed=1, held_out=held.rows,
                       exclude=held.hashes)
    blocks = [item["input_ids"].numpy() for item in stream]
    stats = stream.stats()
    stream.close()
    trained = _whole_documents(np.concatenate(blocks), eos, tok, known)
    assert trained and not val & set(trained)
    removed = stats["validation_repeats_removed"]
    rows = {label: held.rows[label].rows for label in ("a", "b")}
    assert removed["b"] == sum(1 for i, t in enumerate(b) if i >= rows["b"] and t in val)
    assert removed["a"] == sum(1 for i, t in enumerate(a) if i >= rows["a"] and t in val) and removed["b"] > 0
    assert json.dumps(stats)  # plain data, as the metadata takes it


def test_the_streaming_trainer_drops_repeats_of_its_hold_out_and_reports_them(tokenizer: Path, tmp_path: Path) -> None:
    from tests.helpers import train_streamed

    cfg, a, b = _repeats_config(tmp_path)
    # no shuffle buffer: the hold-out's rows are each source's first ones, so b's copies of a's are later rows
    train_streamed(tmp_path, cfg, tokenizer, shuffle_buffer=0, num_workers=0, target_tokens=60 * 4 * BLOCK,
                   eval_steps=100, save_steps=100)
    run = tmp_path / "ckpt" / "run"
    report = json.loads((run / "val_report.json").read_text())
    metadata = json.loads((run / "training_metadata.json").read_text())
    removed = metadata["stream"]["training"]["validation_repeats_removed"]
    assert removed["b"] >= 1 and "document_hashes" not in metadata["stream"]["validation"]
    assert len(report["document_hashes"]) >= report["sources"]["a"]["documents"]


def test_a_single_document_builds_its_start_held_out_and_its_rest_trained(tokenizer: Path, tmp_path: Path) -> None:
    """A source of one 40-56 KB document never built, at any VAL_TOKENS, and the error's advice did not help: the
    validation split takes its first piece, training the rest, and the two are the document."""
    text = "a00000 " + " ".join(random.Random(11).choices(WORDS, k=7000))
    write_jsonl(tmp_path / "one.jsonl", [text])
    assert 40_000 < len(text) < 56_000
    mix = [{"name": "json", "prob": 1.0, "data_files": str(tmp_path / "one.jsonl")}]
    cfg = write_config(tmp_path / "mix.json", mix, context_length=BLOCK, target_tokens=4_000)
    out = tmp_path / "ds"
    proc = run_script("build_dataset_v5.py", "--config", cfg, "--tokenizer_dir", tokenizer, "--output_dir", out,
                      "--num_workers", 0)
    assert proc.returncode == 0, proc.stderr
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    val, train = (np.asarray(PackedDataset(out, split).tokens).reshape(-1) for split in ("val", "train"))
    ids = tok.encode(text, add_special_tokens=False).ids
    assert len(val) > 0 and val.tolist() == ids[:len(val)]  # its start
    assert train.tolist() == ids[len(val):len(val) + len(train)]  # and what follows, from the next token on


def test_too_few_training_tokens_after_removing_repeats_of_validation_says_how_many(tokenizer: Path,
                                                                                    tmp_path: Path) -> None:
    """5,000 identical one-token documents: all but the hold-out's are repeats of a validation document, dropped;
    the message counts them (it said 'read: 32 documents' and advised a lower VAL_TOKENS)."""
    write_jsonl(tmp_path / "same.jsonl", ["alpha"] * 5000)
    mix = [{"name": "json", "prob": 1.0, "data_files": str(tmp_path / "same.jsonl")}]
    cfg = write_config(tmp_path / "mix.json", mix, context_length=BLOCK)
    proc = run_script("build_dataset_v5.py", "--config", cfg, "--tokenizer_dir", tokenizer, "--output_dir",
                      tmp_path / "ds", "--num_workers", 0, "--val_tokens", BLOCK)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "dropped as repeats of validation documents): remove the repeated documents" in line, line
    held, dropped = (int(n.replace(",", "")) for n in re.search(
        r"after (\d+) rows held out for validation, ([\d,]+) document\(s\) dropped", line).groups())
    assert held + dropped == 5000 and dropped > 4900  # every row either held out or dropped, all counted
