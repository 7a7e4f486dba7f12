"""The mix at the edges of the data: one huge document anywhere in a source (first, middle, last) still gives every
prefix its share, in the packed build and in the stream; the same content under another file name is refused; no
validation document is trained on verbatim, in the build and the stream.

Every document starts with its source's tag ("a00012 ", "b00345 "); the huge one with "a-huge". Blocks split at eos
say, independently of SparkNet's own counts, which source each token came from: a segment that starts with no tag
is a piece of the huge document."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from sparknet.config import load_config
from sparknet.data.holdout import hold_out_validation
from sparknet.data.packed.build import BuildSpec, build_dataset
from sparknet.data.packed.dataset import PackedDataset
from sparknet.data.stream.token_stream import TokenStream
from sparknet.errors import UserError
from tests.helpers import run_script, tagged_owners, tagged_segments, write_config, write_jsonl

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


def _sources(tokens: np.ndarray, eos: int, tok: Tokenizer) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """Per token, 1 for source a (its documents and the huge one's pieces, which start with no tag) and 0 for b; and
    the segments' texts and token counts."""
    owner = tagged_owners(tokens, eos, tok.decode, {"a": 1, "b": 0}, untagged=1)
    return owner, [(text, end - start) for start, end, text in tagged_segments(tokens, eos, tok.decode)]


def _assert_every_prefix_mixed(owner: np.ndarray, share: float = 0.5) -> None:
    """Every prefix of whole blocks from 32 blocks on is within 12 points of the share, the whole within 2: one piece
    (8 blocks) is half a prefix of 16 blocks, so nothing tighter holds at the start."""
    per_block = owner.reshape(-1, BLOCK).mean(axis=1)
    prefix = np.cumsum(per_block) / np.arange(1, len(per_block) + 1)
    worst = np.abs(prefix[31:] - share).max()
    assert worst <= 0.12, f"a prefix's share of source a is {share}±{worst:.3f}"
    assert abs(prefix[-1] - share) <= 0.02, prefix[-1]


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

    # the build's validation split takes a's first rows (a huge document there is cut to its cap): "first" is the
    # first document after them (one after, so that the validation split's choices stay those without it)
    _, rows, _ = hold_out_validation(config=load_config(config(len(normal))), tokenizer_json=tok.to_str(), eos_id=eos,
                                     block_size=BLOCK, val_tokens=4_000, seed=1)
    cfg = config({"first": rows["a"] + 1, "middle": 60, "last": len(normal)}[where])
    out = tmp_path / "ds"
    manifest = build_dataset(BuildSpec(config=load_config(cfg), tokenizer=str(tokenizer), output_dir=out,
                                       target_tokens=60_000, val_tokens=4_000, block_size=BLOCK, seed=1))
    owner, texts = _sources(np.asarray(PackedDataset(out, "train").tokens).reshape(-1), eos, tok)
    _assert_every_prefix_mixed(owner)
    assert manifest["complete"] and manifest["shares_missed"] == {}
    assert abs(manifest["splits"]["train"]["sources"]["a"]["share"] - owner.mean()) < 1e-9  # its count is ours
    # the huge document went in as pieces of 8 blocks, each ending with eos (the last piece may be cut by the end)
    pieces = [n for t, n in texts[:-1] if not t.startswith(("a0", "b0"))]
    assert len(pieces) > 5 and set(pieces) == {8 * BLOCK}, pieces

    cfg = config({"first": 0, "middle": 60, "last": len(normal)}[where])  # the stream: no hold-out here
    stream = TokenStream(config=load_config(cfg), tokenizer_json=tok.to_str(), eos_id=eos, block_size=BLOCK, seed=1)
    blocks = []
    for item in stream:
        blocks.append(item["input_ids"].numpy())
        if len(blocks) == 60_000 // BLOCK:
            break
    stream.close()
    owner, _ = _sources(np.concatenate(blocks), eos, tok)
    _assert_every_prefix_mixed(owner)


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
    """The documents among the segments between eos (cut validation documents are matched by prefix)."""
    out = []
    start = 0
    for end in np.flatnonzero(tokens == eos) + 1:
        text = tok.decode(tokens[start:end - 1].tolist())
        start = end
        if text in known:
            out.append(text)
        else:
            prefixed = [k for k in known if k.startswith(text)]
            assert len(prefixed) == 1, text[:40]
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

    config = load_config(cfg)
    val_blocks, rows, report = hold_out_validation(config=config, tokenizer_json=tok.to_str(), eos_id=eos,
                                                   block_size=BLOCK, val_tokens=3_000, seed=1)
    val = set(_whole_documents(val_blocks.reshape(-1), eos, tok, known))
    assert report["document_hashes"] and len(report["document_hashes"]) >= len(val)
    stream = TokenStream(config=config, tokenizer_json=tok.to_str(), eos_id=eos, block_size=BLOCK, seed=1,
                         skip_documents=rows, exclude_documents=report["document_hashes"])
    blocks = [item["input_ids"].numpy() for item in stream]
    stats = stream.stats()
    stream.close()
    trained = _whole_documents(np.concatenate(blocks), eos, tok, known)
    assert trained and not val & set(trained)
    removed = stats["validation_repeats_removed"]
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
