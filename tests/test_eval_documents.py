"""Evaluation knows where documents end (issue 49 §4): a validation document cut at its source's cap ends where a
block ends, with no <|endoftext|>, so evaluation reads documents from the split's record of where each item starts
(the manifest's, a streamed run's val_report.json), never from the tokens alone. Checked on a corpus of long
documents from two sources against an independent computation: the validation items found again here from the
source files and the plain tokenizer, and each scored with plain transformers."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import run_script, write_config, write_jsonl

BLOCK = 64
VAL_TOKENS = 4_096  # caps a document at 4096 x 0.5 / 20 = 102 tokens: every long document is cut
WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud green quick".split()


def _texts(tag: str, n: int, seed: int) -> list[str]:
    """Documents that start with their own tag (an @ no text has, so no cut document's tokens can run into the next
    one's in the check below); one in three long (cut at the cap), the others short (whole)."""
    rng = random.Random(seed)
    return [f"@{tag}{i:04d} " + " ".join(rng.choices(WORDS, k=rng.randint(200, 600) if i % 3 == 0 else
                                                    rng.randint(5, 30))) for i in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    from transformers import PreTrainedTokenizerFast

    from sparknet.bpe import train_bpe
    from sparknet.tokenizer import EOT

    tmp = tmp_path_factory.mktemp("eval-docs")
    texts = {"manuals": _texts("m", 300, 1), "notes": _texts("n", 300, 2)}
    for label, docs in texts.items():
        write_jsonl(tmp / f"{label}.jsonl", docs)
    tok = train_bpe(texts["manuals"][:50] + texts["notes"][:50], vocab_size=300)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT).save_pretrained(tmp / "tok")
    mix = [{"name": "json", "prob": 0.5, "data_files": str(tmp / f"{label}.jsonl")}
           for label in texts]
    config = write_config(tmp / "mix.json", mix, context_length=BLOCK, target_tokens=20_000)
    proc = run_script("build_dataset_v5.py", "--config", config, "--tokenizer_dir", tmp / "tok", "--output_dir",
                      tmp / "ds", "--val_tokens", VAL_TOKENS, "--num_workers", 0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"dir": tmp, "texts": texts, "config": config, "tokenizer": tmp / "tok", "dataset": tmp / "ds"}


def _expected_items(corpus: dict[str, object]) -> list[tuple[str, list[int], bool]]:
    """The validation split's items found again without SparkNet's record: each source's tokens in val.bin (by
    val_sources.bin) are its documents in the file's order (the hold-out reads each source in its own order), each
    whole with its <|endoftext|>, or a prefix of it when the hold-out cut it at the cap. Returns (source, the item's
    tokens without <|endoftext|>, whether it is whole) in val.bin's order."""
    from tokenizers import Tokenizer

    dataset = corpus["dataset"]
    manifest = json.loads((dataset / "manifest.json").read_text())
    tok = Tokenizer.from_file(str(corpus["tokenizer"] / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    flat = np.fromfile(dataset / "val.bin", dtype=manifest["dtype"]).astype(np.int64)
    sources = np.fromfile(dataset / "val_sources.bin", dtype="<u2")
    labels = manifest["splits"]["val"]["source_ids"]["labels"]
    items: list[tuple[int, str, list[int], bool]] = []  # (first position, source, tokens, whole)
    for index, label in enumerate(labels):
        positions = np.flatnonzero(sources == index)
        stream = flat[positions].tolist()
        at = 0
        for text in corpus["texts"][label]:
            if at >= len(stream):
                break
            ids = tok.encode(text, add_special_tokens=False).ids
            whole = [*ids, eos]
            if stream[at:at + len(whole)] == whole:
                items.append((int(positions[at]), label, ids, True))
                at += len(whole)
                continue
            taken = 0  # a cut document: the longest prefix of it that is there
            while at + taken < len(stream) and taken < len(ids) and stream[at + taken] == ids[taken]:
                taken += 1
            assert taken > 0, (label, text[:20])
            items.append((int(positions[at]), label, ids[:taken], False))
            at += taken
        assert at == len(stream), label  # every token of the source accounted for
    return [(label, ids, whole) for _, label, ids, whole in sorted(items)]


def test_the_validation_documents_are_the_items_the_build_recorded_each_with_its_source(
        corpus: dict[str, object]) -> None:
    from sparknet.eval.data import load_labelled_documents
    from sparknet.tokenizer import load_tokenizer

    expected = _expected_items(corpus)
    manifest = json.loads((corpus["dataset"] / "manifest.json").read_text())
    val = manifest["splits"]["val"]
    assert any(s["documents_cut"] for s in val["sources"].values())  # the case at hand: cut documents
    texts, labels = load_labelled_documents(str(corpus["dataset"]))
    tok = load_tokenizer(str(corpus["tokenizer"]))
    assert labels == [label for label, _, _ in expected]
    assert texts == [tok.decode(ids) for _, ids, _ in expected]
    for label, info in val["sources"].items():  # the manifest's counts
        assert labels.count(label) == info["documents"], label
    assert len(texts) == val["documents"]


def test_eval_perplexity_scores_each_document_on_its_own_per_source_and_the_card_shows_it(
        corpus: dict[str, object], tmp_path: Path) -> None:
    """eval_perplexity on the dataset: per source, the documents the build counted, the tokens val_sources.bin gives
    each source (less each whole document's <|endoftext|>, which is not text), and the NLL of each document scored
    alone from an <|endoftext|> prefix by plain transformers; the exported card's table says the same."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    from sparknet.tokenizer import load_tokenizer

    run = tmp_path / "checkpoints" / "random"
    torch.manual_seed(0)
    tok = load_tokenizer(str(corpus["tokenizer"]))
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=256, n_embd=32, n_layer=2, n_head=2,
                               bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)).save_pretrained(run)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(corpus["tokenizer"] / name, run / name)
    (run / "training_metadata.json").write_text(json.dumps({"dataset": {"path": str(corpus["dataset"])}}))
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(run)]), "--data", corpus["dataset"],
                      "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = next(iter(json.loads((tmp_path / "eval" / "random" / "perplexity.json").read_text()).values()))

    expected = _expected_items(corpus)
    manifest = json.loads((corpus["dataset"] / "manifest.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(run).eval()
    figures: dict[str, dict[str, float]] = {}
    for label, ids, _ in expected:
        with torch.no_grad():
            logits = model(torch.tensor([[tok.eos_token_id, *ids]])).logits[0, :-1]
        nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids), reduction="sum").item()
        mine = figures.setdefault(label, {"nll": 0.0, "tokens": 0, "documents": 0})
        mine["nll"] += nll
        mine["tokens"] += len(ids)
        mine["documents"] += 1
    sources = np.fromfile(corpus["dataset"] / "val_sources.bin", dtype="<u2")
    labels = manifest["splits"]["val"]["source_ids"]["labels"]
    for label, info in manifest["splits"]["val"]["sources"].items():
        got = row["sources"][label]
        whole = sum(1 for source, _, ended in expected if source == label and ended)  # their <|endoftext|>
        assert got["documents"] == info["documents"] == figures[label]["documents"], label
        assert got["tokens"] == figures[label]["tokens"] == int(np.sum(sources == labels.index(label))) - whole
        assert got["nll"] == pytest.approx(figures[label]["nll"] / figures[label]["tokens"], rel=1e-4), label

    exported = run_script("export_model.py", "--model", run, "--output_dir", tmp_path / "export", "--eval_dir",
                          tmp_path / "eval", "--unfinished", "true")
    assert exported.returncode == 0, exported.stderr[-3000:]
    card = (tmp_path / "export" / "README.md").read_text()
    for label, info in manifest["splits"]["val"]["sources"].items():
        line = next((line for line in card.splitlines() if f"[{label}]" in line), None)
        assert line is not None and f"| {info['documents']} |" in line, (label, line)


def test_a_streamed_runs_validation_blocks_read_as_the_builds_and_its_hold_out_is_not_called_trained_on(
        corpus: dict[str, object], tmp_path: Path) -> None:
    """The stream's hold-out of the same config is val.bin (the build is the stream written to disk): its
    val_blocks.npy is read into the same documents with the same sources, from its own record; and scoring the run on
    the build's validation split warns of no document it "may have trained on": that split is its own hold-out."""
    from sparknet.eval.data import load_labelled_documents
    from tests.helpers import stream_args

    args = stream_args(tmp_path, corpus["config"], corpus["tokenizer"], val_tokens=VAL_TOKENS,
                       target_tokens=2 * 4 * BLOCK, eval_steps=2, save_steps=2, num_workers=0)
    at = args.index("--shuffle_buffer")  # the default, as the build's
    del args[at:at + 2]
    trained = run_script("train_sparknet.py", *args)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = tmp_path / "ckpt" / "run"
    streamed = load_labelled_documents(str(run / "val_blocks.npy"))
    assert streamed == load_labelled_documents(str(corpus["dataset"]))
    assert all(labels is not None for labels in streamed[1:])
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(run)]), "--data", corpus["dataset"],
                      "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0 and "may have trained on" not in proc.stderr, proc.stderr[-3000:]
    row = next(iter(json.loads((tmp_path / "eval" / "run" / "perplexity.json").read_text()).values()))
    manifest = json.loads((corpus["dataset"] / "manifest.json").read_text())
    assert {label: figures["documents"] for label, figures in row["sources"].items()} == {
        label: info["documents"] for label, info in manifest["splits"]["val"]["sources"].items()}
