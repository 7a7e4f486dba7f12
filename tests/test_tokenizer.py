"""The byte-level BPE: lossless on any text, loadable offline with AutoTokenizer, a real end-of-text token."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparknet.common.errors import UserError
from sparknet.tokenizer import EOT, load_tokenizer
from tests.helpers import run_script, write_config, write_jsonl
from tests.hub_server import HubServer

_TOKENIZER_DIR: list[Path] = []


@pytest.fixture(autouse=True)
def _remember(tokenizer_dir: Path) -> None:
    _TOKENIZER_DIR[:] = [tokenizer_dir]


@cache
def auto_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(_TOKENIZER_DIR[0]))


def round_trips(text: str) -> bool:
    tok = auto_tokenizer()
    return tok.decode(tok.encode(text), clean_up_tokenization_spaces=False) == text


def test_loads_offline_with_autotokenizer(tokenizer_dir: Path) -> None:
    tok = auto_tokenizer()
    assert len(tok) == 1024 and tok.model_max_length == 128
    assert tok.eos_token == tok.bos_token == EOT and tok.eos_token_id == tok.bos_token_id
    assert tok.pad_token is None  # nothing is ever padded, so the end-of-text token is never masked as padding
    # the token is there; plain AutoTokenizer encodes its eos string as the eos id, as GPT-2's on the Hub does (the
    # fine-tuning idiom `text + eos_token`), while SparkNet's loader keeps text that spells it text
    # (sparknet.tokenizer's rule: only SparkNet's eos separates documents)
    assert tok.convert_tokens_to_ids(EOT) == tok.eos_token_id
    assert tok("hello" + tok.eos_token)["input_ids"][-1] == tok.eos_token_id
    assert tok(f"a {EOT} b")["input_ids"].count(tok.eos_token_id) == 1
    ours = load_tokenizer(str(tokenizer_dir))
    assert ours.eos_token_id not in ours.encode(f"a {EOT} b") and ours.eos_token_id not in ours.encode(EOT)
    assert ours.decode(ours.encode(f"a {EOT} b")) == f"a {EOT} b"
    added = json.loads((tokenizer_dir / "tokenizer.json").read_text())["added_tokens"]
    assert [(t["content"], t["special"]) for t in added] == [(EOT, True)]
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "split_special_tokens" not in config


def test_every_byte_is_in_the_vocabulary() -> None:
    from tokenizers import pre_tokenizers

    vocab = auto_tokenizer().get_vocab()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    assert len(alphabet) == 256 and all(ch in vocab for ch in alphabet)
    every_byte = bytes(range(256)).decode("latin-1")
    assert round_trips(every_byte)


@pytest.mark.parametrize(
    "text",
    [
        "a\r\nb\rc",
        "\t\tindented\t",
        "nul\x00byte",
        "emoji 😀👍🏽 flags 🇫🇷",
        "combining e\u0301 a\u0308\u0301",
        " " * 37 + "spaces" + " " * 11,
        "",
        "literal <|endoftext|> inside",
        "日本語のテキスト",
        "\ufeffBOM \u200b zero-width",
        "surrogate-free \U0010ffff max",
    ],
)
def test_round_trip_examples(text: str) -> None:
    assert round_trips(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=200))
def test_round_trip_property(text: str) -> None:
    assert round_trips(text)


def test_training_report(tokenizer_dir: Path) -> None:
    report = json.loads((tokenizer_dir / "training_report.json").read_text())
    assert report["vocab_size"] == 1024 and report["max_bytes"] == 300_000 and report["shuffle_buffer"] == 10_000
    sources = report["sources"]
    assert set(sources) == {"prose", "code"}
    # Whole documents: the sample stops at the first one that reaches the budget (these average ~5 kB).
    assert 300_000 <= sum(s["bytes"] for s in sources.values()) < 400_000
    assert sum(s["byte_share"] for s in sources.values()) == pytest.approx(1)
    for s, asked in zip(sources.values(), (0.6, 0.4), strict=True):
        # About one document of either source off the share at this small budget (the exact test is below).
        assert s["requested_share"] == asked and abs(s["byte_share"] - asked) < 0.1
        assert s["bytes"] > 10_000 and s["documents"] > 5 and s["heldout_documents"] == 10
        assert 1.5 < s["heldout_bytes_per_token"] < 8
    assert report["seconds"] > 0 and report["eos_token_id"] == auto_tokenizer().eos_token_id


def _chunks(lines: list[str], size: int) -> list[str]:
    """The lines joined into documents of about `size` bytes each (a document ends at the line that reaches it)."""
    docs, current = [], ""
    for line in lines:
        current += line + "\n"
        if len(current.encode("utf-8")) >= size:
            docs.append(current)
            current = ""
    return docs


def _corpus_lines(corpus_dir: Path, name: str) -> list[str]:
    rows = (json.loads(line)["text"] for line in (corpus_dir / f"{name}.train.jsonl").open(encoding="utf-8"))
    return [line for text in rows for line in text.splitlines() if line.strip()]


def _utf8(texts: list[str]) -> int:
    return sum(len(t.encode("utf-8")) for t in texts)


@pytest.mark.parametrize("shuffle_buffer", [0, pytest.param(10_000, marks=pytest.mark.slow)])  # one in the fast tier
def test_sources_supply_their_share_of_the_bytes(corpus_dir: Path, tmp_path: Path, shuffle_buffer: int) -> None:
    """Documents ~20x longer asked at 0.2 supply 20% of the text, not the ~83% a mix by documents gives them."""
    short = _chunks(_corpus_lines(corpus_dir, "prose"), 250)  # paragraphs of the stdlib's docstrings
    long = _chunks(_corpus_lines(corpus_dir, "code"), 5_000)  # whole stretches of stdlib source
    assert 15 < (_utf8(long) / len(long)) / (_utf8(short) / len(short)) < 25
    cfg = write_config(tmp_path / "mix.json", [
        {"name": "json", "prob": 0.2, "data_files": str(write_jsonl(tmp_path / "long.jsonl", long))},
        {"name": "json", "prob": 0.8, "data_files": str(write_jsonl(tmp_path / "short.jsonl", short))},
    ])
    budget = 1_000_000
    proc = run_script("train_tokenizer_v5.py", "--config", cfg, "--vocab_size", 300, "--max_bytes", budget,
                      "--shuffle_buffer", shuffle_buffer, "--heldout_docs", 5, "--output_dir", tmp_path / "tok")
    assert proc.returncode == 0, proc.stderr
    sources = json.loads((tmp_path / "tok" / "training_report.json").read_text())["sources"]
    total = sources["long"]["bytes"] + sources["short"]["bytes"]
    assert budget <= total < budget + max(len(t.encode("utf-8")) for t in long)
    for label, asked in (("long", 0.2), ("short", 0.8)):
        assert not sources[label]["exhausted"] and sources[label]["requested_share"] == asked
        assert abs(sources[label]["byte_share"] - asked) <= 0.02, sources
    assert sources["long"]["documents"] < 0.05 * (sources["long"]["documents"] + sources["short"]["documents"])
    assert f"{sources['long']['byte_share']:6.1%} (asked 20.0%)" in proc.stdout
    assert proc.stdout.count("column 'text'") == 2 and sources["long"]["text_column"] == "text"  # what was read
    assert "misses the mix" not in proc.stderr  # the shares met: no warning
    if shuffle_buffer == 0:  # each source's order: the sample is the first documents of each file, counted here
        for label, docs in (("long", long), ("short", short)):
            assert sources[label]["bytes"] == _utf8(docs[: sources[label]["documents"]])
        assert abs(_utf8(long[: sources["long"]["documents"]]) / total - 0.2) <= 0.02


def test_a_sample_that_misses_the_mix_is_a_warning_with_the_shares(corpus_dir: Path, tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A source asked at 30% that runs dry at a fraction of it: the tokenizer says so, with the shares, as the build
    of the same config does; and its report says which column each source was read from."""
    from sparknet.bpe import train_tokenizer
    from sparknet.config.mix import load_config

    lines = _corpus_lines(corpus_dir, "prose")
    cfg = write_config(tmp_path / "mix.json", [
        {"name": "json", "prob": 0.3, "data_files": str(write_jsonl(tmp_path / "small.jsonl", lines[:20], "body")),
         "text_field": "body"},
        {"name": "json", "prob": 0.7, "data_files": str(write_jsonl(tmp_path / "big.jsonl", lines[20:3000]))}])
    with caplog.at_level("WARNING", logger="sparknet"):
        report = train_tokenizer(load_config(cfg), tmp_path / "tok", vocab_size=300, max_bytes=60_000, heldout_docs=0)
    small = report["sources"]["small"]
    assert small["exhausted"] and small["byte_share"] < 0.1
    assert (f"the tokenizer's sample misses the mix (bytes): small {small['byte_share']:.1%} for 30.0% (ran dry), "
            f"big {report['sources']['big']['byte_share']:.1%} for 70.0%") in caplog.text, caplog.text
    assert (small["text_column"], report["sources"]["big"]["text_column"]) == ("body", "text")


def _latin_then_cyrillic(corpus_dir: Path) -> list[str]:
    """400 documents of ~1 kB in storage order: 200 of English prose, then the same 200 spelled in Cyrillic."""
    latin = _chunks(_corpus_lines(corpus_dir, "prose"), 1_000)[:200]
    to_cyrillic = str.maketrans("abcdefghijklmnopqrstuvwxyz", "абцдефгхийклмнопярстуввхыз")
    return latin + [doc.translate(to_cyrillic) for doc in latin]


def _train_on(config: Path, out: Path, *args: object) -> bytes:
    """tokenizer.json of the real script run on a quarter of the config's text, the held-out report kept small."""
    proc = run_script("train_tokenizer_v5.py", "--config", config, "--vocab_size", 400, "--max_bytes", 100_000,
                      "--heldout_docs", 2, "--output_dir", out, *args)
    assert proc.returncode == 0, proc.stderr
    return (out / "tokenizer.json").read_bytes()


def _has_cyrillic_tokens(folder: Path) -> bool:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return any("а" <= ch <= "я" for i in range(257, tok.get_vocab_size()) for ch in tok.decode([i]))


@pytest.mark.slow
def test_shuffle_buffer_samples_across_storage_order_and_repeats_with_the_seed(
    corpus_dir: Path, tmp_path: Path
) -> None:
    """The budget covers a quarter of a source stored Latin first: in storage order the tokenizer never sees the
    Cyrillic half; through the shuffle buffer it does, and the same seed gives the very same tokenizer."""
    docs = write_jsonl(tmp_path / "docs.jsonl", _latin_then_cyrillic(corpus_dir))
    mix = [{"name": "json", "prob": 1.0, "data_files": str(docs)}]
    config = write_config(tmp_path / "mix.json", mix)
    in_order = _train_on(config, tmp_path / "in_order", "--shuffle_buffer", 0)
    assert not _has_cyrillic_tokens(tmp_path / "in_order")
    shuffled = _train_on(config, tmp_path / "shuffled")  # the script's SHUFFLE_BUFFER (10,000 documents)
    assert _has_cyrillic_tokens(tmp_path / "shuffled") and shuffled != in_order
    assert _train_on(config, tmp_path / "again") == shuffled
    other_seed = write_config(tmp_path / "seed2.json", mix, seed=2)
    assert _train_on(other_seed, tmp_path / "other_seed") != shuffled


def test_existing_output_is_not_overwritten_silently(tokenizer_dir: Path, corpus_config: Path) -> None:
    before = (tokenizer_dir / "tokenizer.json").read_bytes()
    proc = run_script(
        "train_tokenizer_v5.py",
        "--config",
        corpus_config,
        "--output_dir",
        tokenizer_dir,
        "--vocab_size",
        300,
        "--max_bytes",
        20_000,
    )
    assert proc.returncode == 1 and "already holds a tokenizer" in proc.stderr and "--overwrite true" in proc.stderr
    assert (tokenizer_dir / "tokenizer.json").read_bytes() == before


def test_a_second_training_into_the_same_folder_refuses_at_once(corpus_config: Path, tmp_path: Path) -> None:
    """One writer per tokenizer folder, as per dataset and run: while another process holds the folder (here this
    test, through the same lock), the script says so in one line and trains nothing."""
    import os

    from sparknet.common.locks import exclusive

    out = tmp_path / "tok"
    with exclusive(out, "a tokenizer training"):
        proc = run_script("train_tokenizer_v5.py", "--config", corpus_config, "--output_dir", out, "--vocab_size",
                          300, "--max_bytes", 200_000, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]  # no sampling or training began: its log lines would be here
    assert lines[0].startswith(f"error: {out} is in use: a tokenizer training into it is running as process "
                               f"{os.getpid()} (")
    assert not out.exists() and not (tmp_path / ".tok.building").exists()


def test_load_tokenizer_checks(tmp_path: Path, tokenizer_dir: Path) -> None:
    assert load_tokenizer(str(tokenizer_dir)).eos_token == EOT
    with pytest.raises(UserError, match="holds no tokenizer"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(UserError, match="tokenizer folder ./missing-tok not found"):
        load_tokenizer("./missing-tok")
    with pytest.raises(UserError, match="cannot load tokenizer 'no-such-org/no-such-tokenizer'"):
        load_tokenizer("no-such-org/no-such-tokenizer")  # offline in tests: the Hub path fails fast and clearly


def test_overwrite_never_replaces_a_folder_that_holds_no_tokenizer(corpus_config: Path, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("the user's own file")
    proc = run_script("train_tokenizer_v5.py", "--config", corpus_config, "--output_dir", tmp_path,
                      "--vocab_size", 300, "--max_bytes", 20_000, "--overwrite", "true")
    assert proc.returncode == 1 and "holds no tokenizer: it is never replaced" in proc.stderr
    assert (tmp_path / "notes.txt").read_text() == "the user's own file"


def test_replacing_a_tokenizer_never_leaves_a_half_deleted_one(
    corpus_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash while the old tokenizer is being deleted leaves a whole tokenizer at OUTPUT_DIR (the new one)."""
    import shutil

    import sparknet.bpe as bpe
    from sparknet.config.mix import load_config

    out = tmp_path / "tok"
    config = load_config(corpus_config)
    bpe.train_tokenizer(config, out, vocab_size=300, max_bytes=30_000, heldout_docs=0)
    real_rmtree = shutil.rmtree

    def crash_midway(path: object, *args: object, **kwargs: object) -> None:
        if Path(str(path)).name in ("tok", ".tok.replaced") and Path(str(path)).exists():
            (Path(str(path)) / "tokenizer.json").unlink()  # half deleted, then the process dies
            raise KeyboardInterrupt
        real_rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bpe.shutil, "rmtree", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        bpe.train_tokenizer(config, out, vocab_size=310, max_bytes=30_000, heldout_docs=0,
                                           overwrite=True)
    assert load_tokenizer(str(out)).eos_token == EOT
    assert json.loads((out / "training_report.json").read_text())["vocab_size_requested"] == 310


@pytest.mark.slow
def test_a_mistyped_local_tokenizer_folder_fails_at_once_with_the_nearest_folder(tokenizer_dir: Path) -> None:
    """Online (offline flags off, the Hub at a closed port here, where a lookup spends ~50 s in retries): a near
    miss of a local folder's name is not looked up on the Hub. (Hub ids still are: test_load_tokenizer_checks.)"""
    import os
    import shutil
    import subprocess
    import sys
    import time
    import uuid

    from sparknet.common.runtime import PROJECT_ROOT

    local = PROJECT_ROOT / f"test-tokenizer-{uuid.uuid4().hex[:6]}"
    shutil.copytree(tokenizer_dir, local)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens: a Hub lookup could only fail (after retries)
    code = "import sys; from sparknet.config.cli import run_script; from sparknet.tokenizer import load_tokenizer; " \
           "run_script({}, lambda: load_tokenizer(sys.argv[1]), [])"
    try:
        for typed in (local.name.replace("tokenizer", "tokenizr"), f"{local.name}-v2"):
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-c", code, typed], cwd=PROJECT_ROOT, env=env,
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
            assert f"tokenizer folder {typed} not found" in proc.stderr, proc.stderr[-2000:]
            assert f"Did you mean {local.name}?" in proc.stderr
            assert "huggingface_hub" not in proc.stderr and time.monotonic() - started < 30
    finally:
        shutil.rmtree(local, ignore_errors=True)


def test_a_damaged_tokenizer_folder_is_named_as_damaged(tokenizer_dir: Path, tmp_path: Path) -> None:
    import shutil

    damaged = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, damaged)
    data = (damaged / "tokenizer.json").read_bytes()
    (damaged / "tokenizer.json").write_bytes(data[: len(data) // 2])  # truncated, as by a full disk
    with pytest.raises(UserError, match=r"the tokenizer in .*tok cannot be read .*damaged or truncated") as info:
        load_tokenizer(str(damaged))
    assert "Hub" not in str(info.value)


def test_a_path_under_a_local_folder_is_answered_at_once_naming_what_the_folder_holds(
        corpus_config: Path, hub: HubServer, tmp_path: Path) -> None:
    """`--tokenizer_dir tokenizers/mine`, typed where tokenizers/ exists but mine does not: one line naming the folder
    looked for (beside the user, not in the project) and what tokenizers/ holds, at once; online (through the
    loopback Hub), never a Hub lookup."""
    from tests.helpers import run_where_a_local_folder_is

    for name in ("a", "b"):
        (tmp_path / "tokenizers" / name).mkdir(parents=True)
    lines, seconds = run_where_a_local_folder_is(hub, tmp_path, "build_dataset_v5.py", "--config", corpus_config,
                                                 "--tokenizer_dir", "tokenizers/mine", "--output_dir", tmp_path / "ds")
    assert lines[0].startswith("error: tokenizer folder tokenizers/mine not found"), lines[0]
    assert f"looked for {tmp_path / 'tokenizers' / 'mine'}" in lines[0] and "tokenizers/ holds: a, b" in lines[0]
    assert not hub.requests, hub.requests  # not one Hub lookup (a real Hub's retries took ~50 s to fail)
    assert seconds < 60, seconds
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("max_bytes", [pytest.param(50_000_000, marks=pytest.mark.slow), 300_000])  # one fast
def test_the_sampling_bar_ends_at_what_was_read_without_blank_lines(corpus_config: Path, tmp_path: Path,
                                                                    max_bytes: int) -> None:
    """MAX_BYTES beyond the sources (~4 MB here): the sampling bar, written to a log (not a terminal), ends full at
    the bytes read and says why, not at "20% | 3.86M/19.1M". Within them, it ends full too, though the last whole
    document takes it past MAX_BYTES (it ended at "2.87M/?"). No blank lines either way (the BPE trainer's hidden
    bars printed one per stage)."""
    import re

    proc = run_script("train_tokenizer_v5.py", "--config", corpus_config, "--vocab_size", 512, "--max_bytes",
                      max_bytes, "--heldout_docs", 0, "--output_dir", tmp_path / "tok")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for stream in (proc.stdout, proc.stderr):
        assert "" not in stream.rstrip("\n").split("\n"), stream[-3000:]
    bars = [line for line in proc.stderr.splitlines() if line.startswith("sampling text:")]
    assert bars and "\r" not in proc.stderr, proc.stderr[-3000:]
    end = re.search(r"\| ([\d.]+[kMG]?)/([\d.]+[kMG]?) \[", bars[-1])
    assert end and end.group(1) == end.group(2) and " 100%|" in bars[-1], bars[-1]
    assert ("every source ran dry" in bars[-1]) == (max_bytes > 10_000_000), bars[-1]
    report = json.loads((tmp_path / "tok" / "training_report.json").read_text())
    sampled = sum(s["bytes"] for s in report["sources"].values())
    assert sampled < max_bytes if max_bytes > 10_000_000 else sampled >= max_bytes


@pytest.mark.slow
def test_special_token_text_in_a_document_is_text_in_every_stage_and_the_counts_agree(tmp_path: Path) -> None:
    """A literal "<|endoftext|>" in a document: the build kept it as text, but eval_perplexity re-encoded the
    documents with the HF tokenizer, which made each literal the eos id (2,886 tokens scored where the build's
    encoding gives 2,988). One rule, text, everywhere: the tokenizer trains on it as text, the build and the stream
    encode it as text, and so do evaluation (of the files, and of the packed split decoded and encoded again: the
    script) and generation (any tokenizer SparkNet loads, the export's included); the token counts agree. The
    folders loaded with plain AutoTokenizer encode it as the eos id, as GPT-2's does (the users' `text + eos_token`)."""
    import random

    import numpy as np
    from transformers import AutoTokenizer

    from sparknet.bpe import train_bpe
    from sparknet.config.mix import load_config
    from sparknet.data.encoding.packer import DocumentEncoder
    from sparknet.data.packed.build import BuildSpec, build_dataset
    from sparknet.eval.data import DataRequest
    from sparknet.eval.perplexity import evaluate_perplexity
    from sparknet.export import export_model
    from sparknet.tokenizer import save, wrap
    from tests.helpers import random_run_folder

    rng = random.Random(3)
    words = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone".split()
    texts = [" ".join(rng.choices(words, k=rng.randint(20, 60))) + (f" {EOT} " if i % 2 else " ")
             + " ".join(rng.choices(words, k=rng.randint(5, 30))) for i in range(600)]
    data = write_jsonl(tmp_path / "docs.jsonl", texts)
    config = write_config(tmp_path / "mix.json", [{"name": "json", "prob": 1.0, "data_files": str(data)}],
                          context_length=32)
    tokenizer = tmp_path / "tok"
    trained = train_bpe(texts, vocab_size=400)
    assert "endoftext" in trained.get_vocab()  # trained on as text: its pieces were merged like any word's
    save(wrap(trained, 32), tokenizer)
    dataset = tmp_path / "ds"
    build_dataset(BuildSpec(config=load_config(config), tokenizer=str(tokenizer), output_dir=dataset,
                            target_tokens=20_000, val_tokens=3_000, block_size=32, seed=0))

    hf = AutoTokenizer.from_pretrained(str(tokenizer))
    encoder = DocumentEncoder(hf.backend_tokenizer.to_str(), hf.eos_token_id, np.uint16)
    held = texts[:40]
    flat, lengths = encoder(held)
    assert (flat == hf.eos_token_id).sum() == len(held)  # the build's encoding: one eos per document, no more
    expected = [flat[end - length:end - 1].tolist() for end, length in zip(np.cumsum(lengths), lengths, strict=True)]
    # any tokenizer SparkNet loads (evaluation, generation), of the tokenizer folder or the export, encodes alike
    model = random_run_folder(tokenizer, tmp_path / "checkpoints" / "rand")
    export_model(str(model), tmp_path / "exported", eval_root=str(tmp_path / "eval"))
    for loaded in (load_tokenizer(str(tokenizer)), load_tokenizer(str(tmp_path / "exported")),
                   AutoTokenizer.from_pretrained(str(tmp_path / "exported"), split_special_tokens=True)):
        assert loaded(held, add_special_tokens=False)["input_ids"] == expected
    # the folders themselves, loaded plainly, encode the eos string as the eos id (a user's `text + eos_token`)
    for folder in (tokenizer, tmp_path / "exported"):
        plain = AutoTokenizer.from_pretrained(str(folder))
        assert plain(held[1], add_special_tokens=False)["input_ids"].count(plain.eos_token_id) == 1

    # evaluation scores what the build encoded: the files, and (the script) the packed split decoded and encoded
    (row,) = evaluate_perplexity([str(model)], DataRequest(str(write_jsonl(tmp_path / "held.jsonl", held))),
                                 context=32, eval_root=str(tmp_path / "eval"))
    assert row["tokens"] == sum(len(ids) for ids in expected)
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(model)]), "--context", 32, "--eval_dir",
                      tmp_path / "eval", "--data", dataset)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scored = {row["data"]: row["tokens"] for row in json.loads(
        (tmp_path / "eval" / "rand" / "perplexity.json").read_text()).values()}
    val = np.fromfile(dataset / "val.bin", dtype=np.uint16)
    assert scored[str(dataset)] == int((val != hf.eos_token_id).sum())
