"""The byte-level BPE: lossless on any text, loadable offline with AutoTokenizer, a real end-of-text token."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparknet.errors import UserError
from sparknet.tokenizer import EOT, load_tokenizer
from tests.conftest import run_script

_TOKENIZER_DIR: list[Path] = []


@pytest.fixture(autouse=True)
def _remember(tokenizer_dir: Path) -> None:
    _TOKENIZER_DIR[:] = [tokenizer_dir]


@cache
def auto_tokenizer():  # noqa: ANN201 - a transformers tokenizer
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
    assert tok.encode(EOT) == [tok.eos_token_id]
    added = json.loads((tokenizer_dir / "tokenizer.json").read_text())["added_tokens"]
    assert [(t["content"], t["special"]) for t in added] == [(EOT, True)]
    assert (
        json.loads((tokenizer_dir / "tokenizer_config.json").read_text())["tokenizer_class"]
        == "PreTrainedTokenizerFast"
    )


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
    assert report["vocab_size"] == 1024 and report["max_docs"] == 200
    sources = report["sources"]
    assert set(sources) == {"prose", "code"}
    assert sum(s["documents"] for s in sources.values()) == 200
    assert sources["prose"]["documents"] == 120 and sources["code"]["documents"] == 80  # 0.6 / 0.4
    for s in sources.values():
        assert s["bytes"] > 10_000 and s["heldout_documents"] == 10
        assert 1.5 < s["heldout_bytes_per_token"] < 8
    assert report["seconds"] > 0 and report["eos_token_id"] == auto_tokenizer().eos_token_id


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
        "--max_docs",
        20,
    )
    assert proc.returncode == 1 and "already holds a tokenizer" in proc.stderr and "--overwrite true" in proc.stderr
    assert (tokenizer_dir / "tokenizer.json").read_bytes() == before


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
                      "--vocab_size", 300, "--max_docs", 20, "--overwrite", "true")
    assert proc.returncode == 1 and "holds no tokenizer: it is never replaced" in proc.stderr
    assert (tmp_path / "notes.txt").read_text() == "the user's own file"


def test_replacing_a_tokenizer_never_leaves_a_half_deleted_one(
    corpus_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash while the old tokenizer is being deleted leaves a whole tokenizer at OUTPUT_DIR (the new one)."""
    import shutil

    import sparknet.tokenizer as tokenizer_module
    from sparknet.config import load_config

    out = tmp_path / "tok"
    config = load_config(corpus_config)
    tokenizer_module.train_tokenizer(config, out, 300, 30, heldout_docs=0)
    real_rmtree = shutil.rmtree

    def crash_midway(path: object, *args: object, **kwargs: object) -> None:
        if Path(str(path)).name in ("tok", ".tok.replaced") and Path(str(path)).exists():
            (Path(str(path)) / "tokenizer.json").unlink()  # half deleted, then the process dies
            raise KeyboardInterrupt
        real_rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tokenizer_module.shutil, "rmtree", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        tokenizer_module.train_tokenizer(config, out, 310, 30, heldout_docs=0, overwrite=True)
    assert load_tokenizer(str(out)).eos_token == EOT
    assert json.loads((out / "training_report.json").read_text())["vocab_size_requested"] == 310
