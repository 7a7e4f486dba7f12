"""The token stream: the mix from the first blocks, laziness, parallel encoding, exact resume, ranks, dry sources,
bad input, the validation hold-out, and (slow) memory and start-up on a ~1 GB file.

Every document carries its source and number at its start ("L00012 ...", "s00345 ..."), so decoded blocks split at
eos say independently of the stream which source each token came from.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from sparknet.common.errors import UserError
from sparknet.common.runtime import PROJECT_ROOT
from sparknet.config.mix import MixConfig, load_config
from sparknet.data.holdout import hold_out
from sparknet.data.spec import DataSpec, Part
from sparknet.data.stream.token_stream import TokenStream
from tests.helpers import OFFLINE_ENV, stream_of, tagged_documents, write_config, write_jsonl

BLOCK = 128
WORDS = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud green quick "
         "brown lazy dog fox jumps over under light night").split()


def read_texts(tag: str, n: int, words: tuple[int, int], seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{tag}{i:05d} " + " ".join(rng.choices(WORDS, k=rng.randint(*words))) for i in range(n)]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Short documents (~6 tokens) and long ones (~30x longer)."""
    folder = tmp_path_factory.mktemp("stream-data")
    write_jsonl(folder / "short.jsonl", read_texts("s", 12000, (1, 3), seed=1))
    write_jsonl(folder / "long.jsonl", read_texts("L", 500, (180, 320), seed=2))
    write_jsonl(folder / "few.jsonl", read_texts("L", 60, (180, 320), seed=3))  # runs dry early
    write_jsonl(folder / "tiny.jsonl", read_texts("L", 10, (180, 320), seed=4))  # dry after ~20 blocks
    return folder


@pytest.fixture(scope="module")
def tokenizer(data: Path) -> tuple[str, int]:
    from sparknet.bpe import train_bpe
    from sparknet.tokenizer import EOT

    tok = train_bpe(read_texts("s", 300, (1, 3), 4) + read_texts("L", 30, (180, 320), 5), vocab_size=400)
    return tok.to_str(), tok.token_to_id(EOT)


def _config(folder: Path, tmp: Path, long: str = "long", long_prob: float = 0.3) -> MixConfig:
    mix = [{"name": "json", "prob": long_prob, "data_files": str(folder / f"{long}.jsonl")},
           {"name": "json", "prob": 1 - long_prob, "data_files": str(folder / "short.jsonl")}]
    return load_config(write_config(tmp / "mix.json", mix, context_length=BLOCK))


def _stream(config: MixConfig, tokenizer: tuple[str, int], **kw: object) -> TokenStream:
    return stream_of(config, tokenizer[0], tokenizer[1], **{"block_size": BLOCK, "seed": 0, **kw})


def _hold_out(config: MixConfig, tokenizer: tuple[str, int], **kw: object) -> tuple[np.ndarray, Part, dict]:
    """The hold-out's blocks, the training part after it, and its report."""
    held = hold_out(DataSpec(config=config, tokenizer_json=tokenizer[0], eos_id=tokenizer[1],
                             **{"block_size": BLOCK, "seed": 0, **kw}))
    return held.blocks, Part(held_out=held.rows, exclude=frozenset(held.hashes)), held.report


def _take(stream: TokenStream, n: int | None = None) -> np.ndarray:
    out = []
    for item in stream:
        assert item["input_ids"].dtype == torch.long and item["labels"] is item["input_ids"]
        out.append(item["input_ids"].numpy())
        if len(out) == n:
            break
    return np.stack(out) if out else np.empty((0, BLOCK), dtype=np.int64)


def _tag(text: str) -> str | None:
    return match.group(0) if (match := re.match(r"[Ls]\d{5}", text)) else None


def _documents(blocks: np.ndarray, tokenizer: tuple[str, int]) -> list[tuple[str, int]]:
    """(decoded text, tokens with its eos) of each document in order, read back from the tags at their starts (the
    pieces of a long document joined; tests/helpers.py `tagged_documents`)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer[0])
    _, docs = tagged_documents(blocks.reshape(-1), blocks.shape[1], tokenizer[1], tok.decode, _tag)
    return [(doc["text"], doc["tokens"]) for doc in docs]


def _shares(docs: list[tuple[str, int]]) -> dict[str, float]:
    tokens = {"long": 0, "short": 0}
    for text, n in docs:
        tokens["long" if text.startswith("L") else "short"] += n
    total = sum(tokens.values())
    return {label: n / total for label, n in tokens.items()}


def _ids(blocks: np.ndarray, tokenizer: tuple[str, int]) -> list[str]:
    return [text.split(" ", 1)[0] for text, _ in _documents(blocks, tokenizer)]


def _round_trip(state: dict) -> dict:
    """Through JSON and through torch.save/torch.load(weights_only=True), as a checkpoint would store it."""
    buffer = io.BytesIO()
    torch.save(json.loads(json.dumps(state)), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_token_shares_follow_the_mix_from_the_first_blocks(data: Path, tokenizer, tmp_path: Path) -> None:
    stream = _stream(_config(data, tmp_path), tokenizer)
    blocks = _take(stream, 400)
    docs = _documents(blocks, tokenizer)
    mean = {kind: np.mean([n for text, n in docs[:-1] if text.startswith(kind)]) for kind in "Ls"}
    assert 20 < mean["L"] / mean["s"] < 45  # the long documents really are ~30x longer
    shares = _shares(docs)
    assert abs(shares["long"] - 0.3) <= 0.01, shares
    stats = stream.stats()
    assert stats["shares"] == pytest.approx(shares, abs=1e-12)  # the stream's own count agrees, token for token
    assert sum(stats["tokens"].values()) == 400 * BLOCK and stats["blocks"] == 400
    assert stats["tokens_per_second"] > 0
    early = _shares(_documents(blocks[:100], tokenizer))
    assert abs(early["long"] - 0.3) <= 0.02, early  # already after 100 blocks


def test_reads_only_a_bounded_window_ahead(data: Path, tokenizer, tmp_path: Path) -> None:
    stream = _stream(_config(data, tmp_path), tokenizer, batch_docs=64, shuffle_buffer=10)
    _take(stream, 1)
    for source in stream._pipeline.sources.values():
        # in-flight batches (2) + the one being handed out, plus the shuffle buffer: nothing proportional to the data
        assert source.reader.rows <= 3 * 64 + 10, source.reader.rows


def test_feeds_a_dataloader_and_refuses_its_workers(data: Path, tokenizer, tmp_path: Path) -> None:
    stream = _stream(_config(data, tmp_path), tokenizer)
    batch = next(iter(torch.utils.data.DataLoader(stream, batch_size=8)))
    assert batch["input_ids"].shape == (8, BLOCK) and torch.equal(batch["input_ids"], batch["labels"])
    assert stream.state_dict()["blocks_yielded"] == 8  # no read-ahead of blocks in the loader itself
    with pytest.raises(Exception, match="DataLoader worker processes"):
        next(iter(torch.utils.data.DataLoader(_stream(_config(data, tmp_path), tokenizer), num_workers=1)))


RESUME_CASES = [
    pytest.param({"shuffle_buffer": 0}, 0, id="plain"),
    pytest.param({"shuffle_buffer": 50}, 0, id="shuffled"),
    pytest.param({"shuffle_buffer": 0}, 2, id="plain-2workers"),
    pytest.param({"shuffle_buffer": 50}, 2, id="shuffled-2workers"),
    pytest.param({"shuffle_buffer": 5, "long": "tiny"}, 0, id="past-a-dry-source"),
    pytest.param({"shuffle_buffer": 20, "on_exhausted": "restart", "long": "tiny"}, 0, id="restarting"),
]
_references: dict[str, np.ndarray] = {}


@pytest.mark.parametrize(("settings", "workers"), RESUME_CASES)
def test_resume_continues_exactly(data: Path, tokenizer, tmp_path: Path, settings: dict, workers: int) -> None:
    """Blocks after a restored state equal those of an uninterrupted stream, whatever the number of encoders (the
    uninterrupted reference encodes in this process), with states taken mid-document."""
    settings = dict(settings)
    config = _config(data, tmp_path, long=settings.pop("long", "long"))
    key = json.dumps(settings, sort_keys=True)
    if key not in _references:
        _references[key] = _take(_stream(config, tokenizer, **settings), 300)
    reference = _references[key]
    cuts = [137, 300] if workers else [1, 40, 97, 160, 233, 300]
    stream = _stream(config, tokenizer, num_workers=workers, **settings)
    done, cut_documents = 0, []
    for cut in cuts:
        got = _take(stream, cut - done)
        np.testing.assert_array_equal(got, reference[done:cut])
        state = stream.state_dict()
        assert state["blocks_yielded"] == cut
        cut_documents.append(state["current"] is not None)  # the block boundary cut a document
        stream.close()
        stream = _stream(config, tokenizer, num_workers=workers, **settings)
        stream.load_state_dict(_round_trip(state))
        done = cut
    assert sum(cut_documents) >= len(cuts) // 2
    if settings.get("on_exhausted") is None and config.mix[0].label == "tiny":
        assert stream.stats()["exhausted"] == ["tiny"]
    if settings.get("on_exhausted") == "restart":
        assert stream.stats()["restarts"]["tiny"] >= 3  # resumed across restarts, the buffer spanning passes
    stream.close()


WINDOW = 20


def test_resume_in_shuffle_windows_continues_exactly(data: Path, tokenizer, tmp_path: Path) -> None:
    """With the windowed shuffle on (the streaming trainer's SHUFFLE_WINDOW), positions saved at a window's edge
    (its last block given) and in a window's middle resume with the blocks an uninterrupted stream gives: the window
    made again from its start, in the same order, and handed out from the saved index. The run's end (90 blocks)
    cuts the last window to 10 blocks, and a position inside that one resumes too. Each window is a permutation of
    the unshuffled stream's blocks there."""
    config = _config(data, tmp_path)
    settings = {"shuffle_buffer": 50, "window_blocks": WINDOW, "end_blocks": 90}
    reference = _take(_stream(config, tokenizer, **settings), 90)  # (the stream goes on after its planned end)
    plain = _take(_stream(config, tokenizer, shuffle_buffer=50), 90)
    assert len(reference) == 90 and not np.array_equal(reference, plain)  # the windows shuffle
    for start in range(0, 90, WINDOW):  # within its window, and nothing crosses one
        window, unshuffled = reference[start:start + WINDOW], plain[start:start + WINDOW]
        assert sorted(map(bytes, window)) == sorted(map(bytes, unshuffled)), start
    # (blocks given, index in the window): edges after 20 and 40, middles at 27, 53 and 85 (in the cut last window)
    cuts = [(20, 20), (27, 7), (40, 20), (53, 13), (85, 5)]
    stream, done = _stream(config, tokenizer, **settings), 0
    for cut, index in cuts:
        np.testing.assert_array_equal(_take(stream, cut - done), reference[done:cut])
        state = stream.state_dict()
        assert state["blocks_yielded"] == cut and state["window"]["index"] == index, state["window"]
        stream.close()
        stream = _stream(config, tokenizer, **settings)
        stream.load_state_dict(_round_trip(state))
        done = cut
    np.testing.assert_array_equal(_take(stream, 90 - done), reference[done:])
    stream.close()


def test_ranks_get_disjoint_documents_and_each_carries_the_mix(data: Path, tokenizer, tmp_path: Path) -> None:
    config = _config(data, tmp_path)
    per_rank = [_take(_stream(config, tokenizer, rank=r, world_size=2), 250) for r in range(2)]
    ids = [set(_ids(blocks, tokenizer)) for blocks in per_rank]
    assert not ids[0] & ids[1]
    assert all(int(i[1:]) % 2 == rank for rank in range(2) for i in ids[rank])  # every 2nd row of each source
    for blocks in per_rank:
        assert abs(_shares(_documents(blocks, tokenizer))["long"] - 0.3) <= 0.015


def test_ranks_read_whole_shards_where_the_files_divide_and_resume_exactly(tmp_path: Path, tokenizer) -> None:
    """Each source split into 4 files: 2 ranks read 2 whole files each (every row read once over both), disjoint
    documents that carry the mix, the same validation rows held out as on one process, and a position saved
    mid-file that resumes with the very next block."""
    long, short = read_texts("L", 200, (180, 320), seed=2), read_texts("s", 4000, (1, 3), seed=1)
    mix = []
    for name, texts, prob in (("long", long, 0.3), ("short", short, 0.7)):
        quarter = len(texts) // 4
        files = [str(write_jsonl(tmp_path / f"{name}-{k}.jsonl", texts[k * quarter:(k + 1) * quarter]))
                 for k in range(4)]
        mix.append({"name": "json", "prob": prob, "data_files": files})
    config = load_config(write_config(tmp_path / "mix.json", mix, context_length=BLOCK))
    long_label, short_label = (spec.label for spec in config.mix)
    held = {long_label: 70, short_label: 1100}  # into the 2nd file of each source (50 and 1000 rows a file)
    streams = [_stream(config, tokenizer, rank=r, world_size=2, held_out=held) for r in range(2)]
    per_rank = [_take(stream) for stream in streams]
    ids = [set(_ids(blocks, tokenizer)) for blocks in per_rank]
    assert not ids[0] & ids[1]
    expected = {t.split(" ", 1)[0] for t in long[70:] + short[1100:]}
    assert ids[0] | ids[1] <= expected and len(expected - (ids[0] | ids[1])) <= 4  # all but the last cut pieces
    readers = [stream._pipeline.sources for stream in streams]
    for label, rows in ((long_label, 200), (short_label, 4000)):
        assert all(r[label].reader.split == "shards" for r in readers)
        # each row read once over both ranks, the wholly held-out first file not at all
        assert sum(r[label].reader.rows for r in readers) == rows - rows // 4
    for blocks in per_rank:
        assert abs(_shares(_documents(blocks[: len(blocks) // 2], tokenizer))["long"] - 0.3) <= 0.03

    stream = _stream(config, tokenizer, rank=1, world_size=2, held_out=held)
    first = _take(stream, 37)
    resumed = _stream(config, tokenizer, rank=1, world_size=2, held_out=held)
    resumed.load_state_dict(_round_trip(stream.state_dict()))
    assert np.array_equal(np.concatenate([first, _take(resumed)]), per_rank[1])
    for s in (*streams, stream, resumed):
        s.close()


def test_dry_source_renormalise_warns_once_then_the_stream_ends(data, tokenizer, tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="sparknet"):
        stream = _stream(_config(data, tmp_path, long="few"), tokenizer)
        blocks = _take(stream)
    warnings = [r.getMessage() for r in caplog.records if "'few' ran dry" in r.getMessage()]
    assert len(warnings) == 1 and "go on in proportion" in warnings[0]
    docs = _documents(blocks, tokenizer)
    assert sum(text.startswith("L") for text, _ in docs) == 60  # every document of the dry source, once
    assert stream.stats()["end"] == "every source ran dry" and stream.stats()["exhausted"] == ["few", "short"]
    assert len(_take(stream)) == 0  # iterating again: still at the end


def test_dry_source_stop_ends_the_stream(data: Path, tokenizer, tmp_path: Path, caplog) -> None:
    config = _config(data, tmp_path, long="few")
    with caplog.at_level(logging.WARNING, logger="sparknet"):
        stream = _stream(config, tokenizer, on_exhausted="stop")
        blocks = _take(stream)
    assert any("'few' ran dry" in r.getMessage() and "stops" in r.getMessage() for r in caplog.records)
    renormalised = _take(_stream(config, tokenizer))
    assert 0 < len(blocks) < len(renormalised) / 2
    np.testing.assert_array_equal(blocks, renormalised[: len(blocks)])
    assert abs(_shares(_documents(blocks, tokenizer))["long"] - 0.3) <= 0.03  # the mix held to the end
    assert "few" in stream.stats()["end"]


def test_dry_source_restart_reads_it_again(data: Path, tokenizer, tmp_path: Path) -> None:
    stream = _stream(_config(data, tmp_path, long="few"), tokenizer, on_exhausted="restart")
    blocks = _take(stream, 600)
    assert stream.stats()["restarts"]["few"] >= 1
    ids = [i for i in _ids(blocks, tokenizer) if i.startswith("L")]
    assert len(ids) > len(set(ids)) == 60  # the same 60 documents, again
    assert abs(_shares(_documents(blocks, tokenizer))["long"] - 0.3) <= 0.01  # the share holds across restarts


def test_source_without_text_column_lists_the_columns(tmp_path: Path, tokenizer) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"id": i, "title": "t", "body_html": "<p>"}) + "\n" for i in range(5)))
    config = load_config(write_config(tmp_path / "mix.json", [{"name": "json", "prob": 1, "data_files": str(path)}]))
    with pytest.raises(UserError) as err:
        _take(_stream(config, tokenizer), 1)
    message = str(err.value)
    assert "'rows'" in message and "columns found: id (int), title (str), body_html (str)" in message
    assert "\n" not in message


def test_unreadable_files_name_the_source_and_the_file(data: Path, tokenizer, tmp_path: Path) -> None:
    good = write_jsonl(tmp_path / "broken.jsonl", ["fine"] * 3)  # the source's first file, which labels it
    bad = tmp_path / "broken-2.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n{not json\n")
    config = load_config(write_config(tmp_path / "a.json", [{"name": "json", "prob": 1,
                                                              "data_files": [str(good), str(bad)]}]))
    # the file being read, alone (from the stream's position), not both files of the source
    with pytest.raises(UserError, match=rf"cannot read source 'broken' \({re.escape(str(bad))}\): .*JSON") as err:
        _take(_stream(config, tokenizer), 1)
    assert "\n" not in str(err.value)
    moved = write_jsonl(tmp_path / "moved.jsonl", ["text"])
    config = load_config(write_config(tmp_path / "b.json", [{"name": "json", "prob": 1, "data_files": str(moved)}]))
    moved.unlink()
    moved.mkdir()  # a folder where the config (checked when loaded) had a file
    with pytest.raises(UserError, match=rf"source 'moved' .*{re.escape(str(moved))}"):
        _take(_stream(config, tokenizer), 1)


def test_no_block_at_all_is_an_error_saying_every_source_ran_dry(tmp_path: Path, tokenizer) -> None:
    mix = [{"name": "json", "prob": 1, "data_files": str(write_jsonl(tmp_path / f"{n}.jsonl", [f"a b {n}", "c"]))}
           for n in ("one", "two")]
    config = load_config(write_config(tmp_path / "mix.json", mix))
    with pytest.raises(UserError, match="every source ran dry before one block of 128 tokens"):
        _take(_stream(config, tokenizer), 1)
    with pytest.raises(UserError, match="'one' ran dry .*ON_EXHAUSTED=stop.* before one block"):
        _take(_stream(config, tokenizer, on_exhausted="stop"), 1)


def test_settings_are_checked(data: Path, tokenizer, tmp_path: Path) -> None:
    config = _config(data, tmp_path)
    with pytest.raises(UserError, match="ON_EXHAUSTED='loop': expected renormalise, stop, restart or fail"):
        _stream(config, tokenizer, on_exhausted="loop")
    with pytest.raises(UserError, match="the hold-out's rows name no source of the mix: nope"):
        _stream(config, tokenizer, held_out={"nope": 3})
    state = _stream(config, tokenizer).state_dict()
    with pytest.raises(UserError, match="other data settings .*block_size: 128 -> 64"):
        _stream(config, tokenizer, block_size=64).load_state_dict(state)


@pytest.mark.parametrize("shuffle_buffer", [0, 30])
def test_validation_hold_out_and_training_share_no_token_and_lose_none(data: Path, tokenizer, tmp_path: Path,
                                                                        shuffle_buffer: int) -> None:
    """The hold-out: the first blocks of the mix in the sources' order, deterministic, on the mix; training after it
    (through its shuffle buffer) takes every document the hold-out did not, and the rest of each one it cut: each
    document's text is its validation part followed by its training part, whole, once."""
    config = _config(data, tmp_path, long="few")
    val, part, report = _hold_out(config, tokenizer, val_tokens=100 * BLOCK - 5, shuffle_buffer=shuffle_buffer)
    assert val.shape == (100, BLOCK) and val.dtype == np.uint16
    again = _hold_out(config, tokenizer, val_tokens=100 * BLOCK - 5, shuffle_buffer=shuffle_buffer)
    np.testing.assert_array_equal(val, again[0])  # deterministic
    assert part == again[1] and report == again[2]
    val_docs = _documents(val, tokenizer)
    shares = _shares(val_docs)
    assert abs(shares["long"] - 0.3) <= 0.03 and report["sources"]["few"]["share"] == pytest.approx(shares["long"])
    train = _take(_stream(config, tokenizer, shuffle_buffer=shuffle_buffer, held_out=part.held_out,
                          exclude=part.exclude))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer[0])
    every = {text.split(" ", 1)[0]: text for text in [*read_texts("L", 60, (180, 320), seed=3),
                                                     *read_texts("s", 12000, (1, 3), seed=1)]}
    val_tokens = {text.split(" ", 1)[0]: n for text, n in val_docs}
    trained = tok.decode(train.reshape(-1).tolist())
    rests = {f"{'L' if label == 'few' else 's'}{row:05d}": token
             for label, rows in part.held_out.items() for row, token in rows.rests.items()}
    assert len(rests) >= 10
    for tag, token in rests.items():  # the hold-out's part of each document it cut, then training's, whole
        ids = tok.encode(every[tag], add_special_tokens=False).ids
        assert 0 < token <= len(ids) and val_tokens[tag] == token, tag
        assert tok.decode(ids[token:]) in trained, tag
    whole = {tag for tag in val_tokens if tag not in rests}
    train_ids = set(_ids(train, tokenizer))
    assert not whole & train_ids and not set(rests) & train_ids  # a document's start is in one split only
    missing = set(every) - whole - set(rests) - train_ids
    # nothing lost but the documents of the final partial block (a shuffle buffer holds back none of the hold-out's)
    assert len(missing) <= BLOCK // 2, sorted(missing)[:20]


def test_a_small_hold_out_takes_the_start_of_long_documents_and_training_the_rest(data: Path, tokenizer,
                                                                                  tmp_path: Path) -> None:
    """40 blocks at 30% would hold about seven whole long documents: it takes their first 5120 x 0.3 / 20 = 77
    tokens or so (ending with a block: at most a block more), so it carries the mix in ~20 pieces of them; training
    starts with their rests."""
    config = _config(data, tmp_path)
    val, part, report = _hold_out(config, tokenizer, val_tokens=40 * BLOCK)
    long = report["sources"]["long"]
    assert long["document_cap_tokens"] == 77 and long["documents_cut"] >= 10 and long["documents"] >= 12
    docs = _documents(val, tokenizer)
    assert max(n for text, n in docs[:-1] if text.startswith("L")) < 77 + BLOCK
    assert abs(_shares(docs)["long"] - 0.3) <= 0.04, _shares(docs)
    assert all(1 < token < 77 + BLOCK for token in part.held_out["long"].rests.values())
    train = _take(_stream(config, tokenizer, held_out=part.held_out, exclude=part.exclude), 50)
    assert not set(_ids(val, tokenizer)) & set(_ids(train, tokenizer))


@pytest.mark.slow
def test_large_file_first_block_and_memory(tmp_path: Path, tokenizer) -> None:
    """A ~1 GB JSONL: the first block within 30 s of the process start, and peak RSS (the process and its
    encoders) within 300 MB of the same run on a 10 MB file, read to its end."""
    psutil = pytest.importorskip("psutil")
    rng = random.Random(0)
    lines = [json.dumps({"text": " ".join(rng.choices(WORDS, k=700))}) + "\n" for _ in range(200)]
    chunk = "".join(lines)
    big, small = tmp_path / "big.jsonl", tmp_path / "small.jsonl"
    for path, size in ((big, 2**30), (small, 10 * 2**20)):
        with path.open("w") as f:
            for _ in range(size // len(chunk) + 1):
                f.write(chunk)
    (tmp_path / "tok.json").write_text(tokenizer[0])
    child = textwrap.dedent(f"""
        import json, sys, time, psutil
        from sparknet.config.mix import load_config
        from sparknet.data.spec import DataSpec
        from sparknet.data.stream.token_stream import TokenStream
        start = psutil.Process().create_time()
        config = load_config(sys.argv[1])
        stream = TokenStream(DataSpec(config=config, tokenizer_json=open({str(tmp_path / "tok.json")!r}).read(),
                                      eos_id={tokenizer[1]}, block_size=1024, seed=0, num_workers=2))
        n, first = 0, None
        for _ in stream:
            n += 1
            if first is None:
                first = time.time() - start
            if n == 15000:  # ~15M tokens: the 10 MB file ends first, the large one is read ~100 MB deep
                break
        print(json.dumps({{"first_block_s": first, "blocks": n, "seconds": time.time() - start}}))
        stream.close()
    """)
    figures = {}
    for path in (small, big):
        cfg = write_config(tmp_path / f"{path.stem}.json", [{"name": "json", "prob": 1, "data_files": str(path)}],
                           context_length=1024)
        proc = subprocess.Popen([sys.executable, "-c", child, str(cfg)], cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, **OFFLINE_ENV})
        parent, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            try:
                peak = max(peak, sum(p.memory_info().rss for p in [parent, *parent.children(recursive=True)]))
            except psutil.Error:
                pass
            time.sleep(0.02)
        out, err = proc.communicate()
        assert proc.returncode == 0, err[-3000:]
        figures[path.stem] = {**json.loads(out.strip().splitlines()[-1]), "peak_rss_mb": peak / 2**20,
                              "file_mb": path.stat().st_size / 2**20}
    big.unlink()  # pytest keeps the last temporary folders: not a gigabyte of them
    print(f"\n[stream on a large file] {json.dumps(figures, indent=1)}")
    assert figures["big"]["first_block_s"] < 30
    assert figures["big"]["peak_rss_mb"] - figures["small"]["peak_rss_mb"] < 300
