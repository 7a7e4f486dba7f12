"""The eval loss per mix source (issue 33), checked against a computation that shares nothing with the trainers': the
exported model loaded by plain `transformers`, run over the validation blocks as the run kept them, its per-token
cross-entropy grouped by each token's source as read back from the decoded text.

Every document starts with its source's tag ("a00012 ", "b00345 "), so splitting the blocks at eos and decoding each
segment says which source every token came from, whatever SparkNet recorded. The two sources' files are both named
docs.jsonl, so their labels are "docs#1" and "docs#2" (LABEL_RULE): a label with a character other than letters
flows through TensorBoard tags, the metadata and the card."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import (
    finish_ok,
    read_events,
    run_script,
    start_script,
    stream_args,
    tagged_owners,
    train_packed,
    train_settings,
    write_config,
    write_jsonl,
)

BLOCK = 64
WORDS = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud green quick "
         "brown lazy dog fox jumps over under light night").split()
LABELS = ["docs#1", "docs#2"]
TAGS = {"a": "docs#1", "b": "docs#2"}  # a document's first letter: its source's label


def _texts(tag: str, n: int, seed: int) -> list[str]:
    """Documents of one source: the tag, then random words; source b's are longer, so that blocks join both."""
    rng = random.Random(seed)
    lengths = (5, 40) if tag == "a" else (30, 150)
    return [f"{tag}{i:05d} " + " ".join(rng.choices(WORDS, k=rng.randint(*lengths))) for i in range(n)]


@pytest.fixture(scope="module")
def mix(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The mix config (two sources, 60/40, context BLOCK) and a small byte-level BPE folder trained on them."""
    from transformers import PreTrainedTokenizerFast

    from sparknet.bpe import train_bpe
    from sparknet.tokenizer import EOT

    tmp = tmp_path_factory.mktemp("mix")
    texts = {tag: _texts(tag, 3000, seed) for tag, seed in (("a", 1), ("b", 2))}
    files = {tag: write_jsonl(tmp / tag / "docs.jsonl", docs) for tag, docs in texts.items()}
    config = write_config(tmp / "mix.json", [{"name": "json", "prob": 0.6, "data_files": str(files["a"])},
                                             {"name": "json", "prob": 0.4, "data_files": str(files["b"])}],
                          context_length=BLOCK)
    tok = train_bpe(texts["a"][:300] + texts["b"][:300], vocab_size=400)
    tokenizer = tmp / "tok"
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOT).save_pretrained(tokenizer)
    return config, tokenizer


def _sources_from_text(blocks: np.ndarray, tokenizer: object) -> np.ndarray:
    """Each token's source index (into LABELS), from the text: the tokens up to and with each eos are one document,
    whose decoded text starts with its tag. The blocks start with a whole document (the hold-out and the packed
    validation split both start at the mix's start); tokens after the last eos are the last document's."""
    owner = tagged_owners(blocks, tokenizer.eos_token_id, tokenizer.decode,
                          {tag: LABELS.index(label) for tag, label in TAGS.items()})
    assert (owner >= 0).all()
    return owner


def independent_figures(model_dir: Path, blocks: np.ndarray) -> dict[str, dict[str, float]]:
    """Per source label: the mean cross-entropy of its predicted tokens (every token but each block's first, whose
    source is that of the token predicted), their count and bits per byte, from a plain transformers forward of the
    exported model over `blocks`, with torch's cross-entropy and the bytes of the decoded tokens (ASCII text)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    owner = _sources_from_text(blocks, tokenizer)[:, 1:].reshape(-1)
    ids = torch.from_numpy(blocks.astype(np.int64))
    with torch.no_grad():
        logits = torch.cat([model(input_ids=ids[i:i + 8]).logits for i in range(0, len(ids), 8)])
    losses = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).double(), ids[:, 1:].flatten(),
                                               reduction="none").numpy()
    predicted = blocks[:, 1:].reshape(-1)
    n_bytes = np.array([len(tokenizer.decode([t], skip_special_tokens=True).encode()) for t in predicted])
    figures = {}
    for index, label in enumerate(LABELS):
        mine = owner == index
        loss = float(losses[mine].mean())
        figures[label] = {"loss": loss, "tokens": int(mine.sum()),
                          "bits_per_byte": loss / math.log(2) * mine.sum() / n_bytes[mine].sum()}
    return figures


def _check_run(run_dir: Path, log_dir: Path, blocks: np.ndarray) -> dict[str, dict[str, float]]:
    """The run's metadata and TensorBoard against the independent figures of its exported model; returns those."""
    expected = independent_figures(run_dir, blocks)
    metrics = json.loads((run_dir / "training_metadata.json").read_text())["metrics"]
    recorded = metrics["eval_per_source"]
    assert list(recorded) == LABELS
    for label in LABELS:
        assert recorded[label]["tokens"] == expected[label]["tokens"]
        for name in ("loss", "bits_per_byte"):
            assert recorded[label][name] == pytest.approx(expected[label][name], rel=1e-4), (label, name)
    # the mean of the per-source losses weighted by their tokens is the overall eval loss
    total = sum(figures["tokens"] for figures in recorded.values())
    assert total == blocks.shape[0] * (blocks.shape[1] - 1)
    weighted = sum(figures["loss"] * figures["tokens"] for figures in recorded.values()) / total
    assert weighted == pytest.approx(metrics["eval_loss"], rel=1e-5)
    # TensorBoard at the best checkpoint's step: the exported model's evaluation there
    step = int(Path(metrics["best_checkpoint"]).name.split("-")[1])
    events = read_events(log_dir)
    for label in LABELS:
        for name in ("loss", "bits_per_byte"):
            logged = dict(events[f"eval/{name}/{label}"])
            assert logged[step] == pytest.approx(expected[label][name], rel=1e-4), (label, name)
        assert sorted(dict(events[f"eval/loss/{label}"])) == sorted(dict(events["eval/loss"]))  # every eval
    return expected


@pytest.fixture(scope="module")
def packed_run(mix: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mix built by the build script, as a user runs it, and trained on by the packed trainer in this process,
    as the script runs it (under the returned folder: ds/, ckpt/run/, logs/run/). The trainer script's own path is
    tested end to end elsewhere (tests/test_training.py); here the figures are what count, once for the module."""
    config, tokenizer = mix
    tmp = tmp_path_factory.mktemp("packed")
    proc = run_script("build_dataset_v5.py", "--config", config, "--tokenizer_dir", tokenizer, "--output_dir",
                      tmp / "ds", "--target_tokens", 60_000, "--val_tokens", 1_600, "--num_workers", 0)
    assert proc.returncode == 0, proc.stderr
    # the summary and the manifest say which column each source was read from
    assert proc.stdout.count("column 'text'") == 4, proc.stdout
    assert proc.stdout.count("tokens (each document's <|endoftext|> included)") == 2  # what the count counts
    assert set(json.loads((tmp / "ds" / "manifest.json").read_text())["text_columns"].values()) == {"text"}
    result = train_packed(train_settings(tmp, target_tokens=24 * 4 * BLOCK, sample_steps=0, sample_prompts=[]),
                          tmp / "ds")
    assert result.status == "finished"
    return tmp


def test_packed_run_reports_the_loss_of_each_source(packed_run: Path) -> None:
    """The packed trainer: per-source loss and bits per byte in TensorBoard (every eval) and the metadata equal the
    independent computation over val.bin; their token-weighted mean is the eval loss."""
    blocks = np.fromfile(packed_run / "ds" / "val.bin", dtype=np.uint16).reshape(-1, BLOCK)
    expected = _check_run(packed_run / "ckpt" / "run", packed_run / "logs" / "run", blocks)
    assert all(figures["tokens"] > 300 for figures in expected.values())


def test_the_model_card_has_a_row_per_source(packed_run: Path, tmp_path: Path) -> None:
    """The export's card (export_model, as export_model.py calls it: the script itself is tested in
    tests/test_export.py) holds each source's tokens, loss, perplexity and bits per byte."""
    from sparknet.export import export_model

    run_dir = packed_run / "ckpt" / "run"
    recorded = json.loads((run_dir / "training_metadata.json").read_text())["metrics"]["eval_per_source"]
    card = export_model(str(run_dir), tmp_path / "exported", eval_root=str(tmp_path / "eval"),
                        license="mit").read_text()
    for label, figures in recorded.items():
        row = (f"| {label} | {figures['tokens']:,} | {figures['loss']:.4f} | {math.exp(figures['loss']):.4f} | "
               f"{figures['bits_per_byte']:.4f} |")
        assert row in card, (row, card)


@pytest.mark.slow
def test_eval_perplexity_reports_each_source_of_a_packed_dataset(mix: tuple[Path, Path], packed_run: Path,
                                                                 tmp_path: Path) -> None:
    """eval_perplexity.py on the packed dataset: a result per source, whose documents are those the text says
    are that source's, every token of them scored once, the whole their token-weighted mean."""
    from sparknet.eval.data import load_documents
    from sparknet.tokenizer import load_tokenizer

    dataset = packed_run / "ds"
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(packed_run / "ckpt" / "run")]), "--data",
                      dataset, "--context", BLOCK, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads((tmp_path / "eval" / "run" / "perplexity.json").read_text()).values()
    texts = load_documents(str(dataset))
    tok = load_tokenizer(str(mix[1]))
    assert list(row["sources"]) == LABELS
    for label in LABELS:
        mine = [text for text in texts if TAGS[text[0]] == label]
        assert row["sources"][label]["documents"] == len(mine)
        # every token of each document is scored once (the first predicted from the <|endoftext|> prefix)
        assert row["sources"][label]["tokens"] == sum(len(ids) for ids in tok(mine)["input_ids"])
        assert f"{dataset} [{label}]" in proc.stdout
    weighted = sum(f["nll"] * f["tokens"] for f in row["sources"].values()) / row["tokens"]
    assert weighted == pytest.approx(row["nll"], rel=1e-9)
    # one pass over the windows, one bar (a pass per source made the user wait through a bar per source)
    assert proc.stderr.count("windows: 100%") == 1, proc.stderr


def test_plot_runs_draws_each_source_of_each_run_in_one_figure(packed_run: Path, tmp_path: Path) -> None:
    """plot_runs.py writes loss_per_source.png; its figure has a line per source and run with the logged values,
    a label holding "/" and "@" (a Hub source's subset and revision) included."""
    from torch.utils.tensorboard import SummaryWriter

    from sparknet.eval.plots import draw_figure, plot_runs, read_scalars

    log_dir = packed_run / "logs" / "run"
    # as plot_runs.py draws them (the script itself: tests/test_eval_plots.py)
    written = plot_runs([log_dir], tmp_path / "eval" / "run" / "plots")
    assert (tmp_path / "eval" / "run" / "plots" / "loss_per_source.png") in written
    assert (tmp_path / "eval" / "run" / "plots" / "loss_per_source.png").stat().st_size > 5000
    hub = tmp_path / "hub"
    with SummaryWriter(str(hub)) as writer:
        for step in (0, 10):
            writer.add_scalar("eval/loss", 4.0 - step / 10, step)
            writer.add_scalar("eval/loss/fineweb/sample-10BT@abc1234", 4.5 - step / 10, step)
    runs = {"run": read_scalars(log_dir), "hub": read_scalars(hub)}
    figure = draw_figure(runs, "loss_per_source")
    lines = {line.get_label(): list(line.get_ydata()) for line in figure.axes[0].get_lines()}
    assert sorted(lines) == sorted([*(f"run ({label})" for label in LABELS), "hub (fineweb/sample-10BT@abc1234)"])
    for label in LABELS:
        assert lines[f"run ({label})"] == pytest.approx([value for _, value in runs["run"][f"eval/loss/{label}"]])
    assert lines["hub (fineweb/sample-10BT@abc1234)"] == pytest.approx([4.5, 3.5])


def _stream_run(tmp: Path, config: Path, tokenizer: Path, processes: int) -> str:
    # 15 validation blocks: two processes evaluating 2 blocks per batch get uneven shares (a padded last batch)
    args = stream_args(tmp, config, tokenizer, target_tokens=16 * 4 * BLOCK, val_tokens=15 * BLOCK, eval_steps=8,
                       save_steps=8, sample_prompts=[], num_workers=0)
    return finish_ok(start_script("train_sparknet.py", args, processes=processes), timeout=600)


@pytest.mark.slow
def test_stream_run_reports_the_loss_of_each_source_alike_on_one_and_two_processes(
        mix: tuple[Path, Path], tmp_path: Path) -> None:
    """The streaming trainer on 1 process and under torchrun on 2 (CPU, gloo): the hold-out's per-token sources
    match the text; each run's figures (and its eval loss, their token-weighted mean) match the independent
    computation for its own model; the 2-process run's step-0 figures (the same initial weights, the same hold-out)
    equal the 1-process run's."""
    config, tokenizer = mix
    for name, processes in (("one", 1), ("two", 2)):
        _stream_run(tmp_path / name, config, tokenizer, processes)
    runs = {name: tmp_path / name / "ckpt" / "run" for name in ("one", "two")}
    from transformers import AutoTokenizer

    blocks = np.load(runs["one"] / "val_blocks.npy")
    assert len(blocks) == 15
    recorded = np.load(runs["one"] / "val_sources.npy")
    report = json.loads((runs["one"] / "val_report.json").read_text())
    assert report["source_labels"] == LABELS
    assert np.array_equal(recorded, _sources_from_text(blocks, AutoTokenizer.from_pretrained(tokenizer)))
    assert np.array_equal(np.load(runs["two"] / "val_blocks.npy"), blocks)
    for name in runs:  # the 2-process run's final figures too: exact although one process evaluates a block twice
        _check_run(runs[name], tmp_path / name / "logs" / "run", blocks)
    events = {name: read_events(tmp_path / name / "logs" / "run") for name in runs}
    for tag in ("eval/loss", *(f"eval/{name}/{label}" for label in LABELS for name in ("loss", "bits_per_byte"))):
        one, two = (dict(events[name][tag])[0] for name in runs)
        assert two == pytest.approx(one, rel=1e-5), tag
