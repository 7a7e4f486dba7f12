"""eval_perplexity: the sliding-window NLL equals a plain computation through AutoModelForCausalLM, every token is
scored once, bits per byte count the text's bytes, and bad input is one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from sparknet.eval.models import load_model, resolve_model
from sparknet.eval.perplexity import score_documents, sliding_windows
from tests.helpers import FAST, run_script, write_jsonl

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 9 + "Ünïcödé ✓ 日本語",
         "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 3,
         "short"]


def reference_nll(model_dir: Path, texts: list[str], context: int, stride: int) -> tuple[float, int]:
    """The strided loop of the transformers perplexity guide (each window reads at most `context` tokens and
    predicts the token after each of them), one forward per window, log-softmax in numpy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    total, count = 0.0, 0
    for text in texts:
        ids = [tok.eos_token_id] + tok.encode(text, add_special_tokens=False)
        prev_end = 1  # the <|endoftext|> prefix is context, never a target
        for begin in range(0, len(ids), stride):
            end = min(begin + context + 1, len(ids))  # targets up to end - 1, read up to end - 2
            with torch.no_grad():
                logits = model(torch.tensor([ids[begin:end - 1]])).logits[0].double().numpy()
            logp = logits - logits.max(-1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
            for target in range(prev_end, end):  # the new targets of this window
                total -= logp[target - 1 - begin, ids[target]]
                count += 1
            prev_end = end
            if end == len(ids):
                break
    return total / count, count


@pytest.mark.parametrize("context,stride", [(16, 16), (16, 5), (32, 31)])
def test_nll_matches_plain_computation(random_model: Path, context: int, stride: int) -> None:
    model, tok, _ = load_model(resolve_model(str(random_model)), device="cpu")
    result = score_documents(model, tok, TEXTS, context, stride, batch_size=3, progress=False)
    expected, count = reference_nll(random_model, TEXTS, context, stride)
    assert result.tokens == count == sum(len(tok.encode(t, add_special_tokens=False)) for t in TEXTS)
    assert abs(result.nll - expected) < 1e-4
    assert result.bytes == sum(len(t.encode("utf-8")) for t in TEXTS)
    one_by_one = score_documents(model, tok, TEXTS, context, stride, batch_size=1, progress=False)
    assert abs(one_by_one.nll - result.nll) < 1e-5  # padding in a batch changes nothing


@pytest.mark.parametrize("length,context,stride", [(2, 4, 4), (100, 16, 16), (100, 16, 3), (17, 16, 1), (50, 8, 7)])
def test_windows_score_every_token_once_with_enough_context(length: int, context: int, stride: int) -> None:
    windows = sliding_windows(length, context, stride)
    targets = [t for _, stop, first in windows for t in range(first, stop)]
    assert targets == list(range(1, length))
    for k, (begin, stop, first) in enumerate(windows):
        assert stop - 1 - begin <= context and first > begin  # a window fits the model; each target has context
        if k:
            assert first - begin >= context - stride + 1


def test_bad_stride() -> None:
    from sparknet.common.errors import UserError

    for stride in (0, 5):
        with pytest.raises(UserError, match="STRIDE must be in 1..CONTEXT"):
            sliding_windows(10, 4, stride)


def test_script_writes_json_and_table(random_model: Path, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "val.jsonl", TEXTS, field="body")
    second = tmp_path / "checkpoints" / "other"
    shutil.copytree(random_model, second)
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model), str(second)]), "--data", data,
                      "--text_field", "body", "--context", 16, "--stride", 8, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr
    assert "bits/byte" in proc.stdout and "randrun" in proc.stdout
    # each model's line says its compute threads (issue 52: the rule of tests/test_compute_threads.py)
    assert re.search(rf"{re.escape(str(second))} on cpu, \d+ compute threads? \(", proc.stderr), proc.stderr
    saved = _saved_on(tmp_path / "eval", "randrun", data)
    assert saved["tokens"] > 0 and saved["context"] == 16 and saved["stride"] == 8
    assert saved["bytes"] == sum(len(t.encode("utf-8")) for t in TEXTS)
    table = (tmp_path / "eval" / "randrun_vs_other" / "perplexity.md").read_text()
    assert table.count("\n| ") == 2 and table.startswith("| model")  # header, rule, one row per model
    # what the tokens column counts, said under the table and in the log (the build and the trainer count others)
    assert "\nTokens: each document's own tokens, each scored once from those before it; the build's count" in table
    assert "\ntokens: each document's own tokens, each scored once" in proc.stdout  # under the console table too


def test_bad_input_is_one_line(random_model: Path, tmp_path: Path) -> None:
    not_model = tmp_path / "empty"
    not_model.mkdir()
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(not_model)]), "--data", "x.jsonl")
    assert proc.returncode == 1 and "is not a model folder" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data",
                      str(tmp_path / "missing.jsonl"))
    assert proc.returncode == 1 and "not found" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def _first_rows(path: Path, n: int) -> list[str]:
    """The texts of the first n rows of a JSONL file, read with the json module."""
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line)["text"] for _, line in zip(range(n), f, strict=False)]
    return [t for t in rows if t]


def _saved(eval_root: Path, name: str) -> dict:
    return next(iter(json.loads((eval_root / name / "perplexity.json").read_text()).values()))


def _saved_on(eval_root: Path, name: str, data: object) -> dict:
    """The one result kept on `data` (results are keyed by their whole setting)."""
    (row,) = [row for row in json.loads((eval_root / name / "perplexity.json").read_text()).values()
              if row["data"] == str(data)]
    return row


@pytest.mark.slow
def test_a_dataset_split_scores_that_split_only(random_model: Path, tmp_path: Path) -> None:
    """A folder of data files that `datasets` loads as a Hub dataset would be (its splits from the file names)."""
    from sparknet.tokenizer import load_tokenizer

    folder = tmp_path / "hubby"
    write_jsonl(folder / "train.jsonl", ["training text that is not scored"] * 5)
    write_jsonl(folder / "test.jsonl", TEXTS)
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data", folder,
                      "--split", "test", "--context", 16, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr
    saved = _saved(tmp_path / "eval", "randrun")
    tok = load_tokenizer(str(random_model))
    assert saved["tokens"] == sum(len(tok.encode(t, add_special_tokens=False)) for t in TEXTS)
    assert saved["bytes"] == sum(len(t.encode("utf-8")) for t in TEXTS)
    assert saved["kind"] == "dataset" and saved["split"] == "test"

    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data", folder,
                      "--split", "validation", "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "validation" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data",
                      "sparknet-test/no-such-dataset", "--split", "test", "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "network" in proc.stderr and "Traceback" not in proc.stderr
    # a mistyped local folder (its parent exists) is not taken for a Hub id
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data", "configs/no-such",
                      "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "not found" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_mix_config_scores_the_rows_the_streaming_run_held_out(corpus_config: Path, tokenizer_dir: Path,
                                                                  random_model: Path, tmp_path: Path) -> None:
    from sparknet.config.mix import load_config
    from sparknet.tokenizer import load_tokenizer

    args = {**FAST, "target_tokens": 8 * 4 * 128, "val_tokens": 2048, "shuffle_buffer": 20, "num_workers": 0,
            "sample_steps": 0, "run_name": "streamed", "config": corpus_config, "tokenizer_dir": tokenizer_dir,
            "checkpoints_dir": tmp_path / "ckpt", "logs_dir": tmp_path / "logs"}
    flags = [str(x) for k, v in args.items() for x in (f"--{k}", json.dumps(v) if isinstance(v, list) else v)]
    proc = run_script("train_sparknet.py", *flags)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "ckpt" / "streamed"
    held = json.loads((run / "val_report.json").read_text())["held_out"]
    mix = load_config(corpus_config).mix
    tok = load_tokenizer(str(run))

    def start(text: str, n: int) -> str:
        return tok.decode(tok.encode(text, add_special_tokens=False)[:n])

    # every row the run held out: whole, or (a document cut to the hold-out's cap) the tokens it took of it
    expected = []
    for spec in mix:
        rests = {int(row): int(n) for row, n in dict(held[spec.label]["rests"]).items()}
        texts = _first_rows(Path(spec.data_files), held[spec.label]["rows"])
        expected += [start(text, rests[i]) if i in rests else text for i, text in enumerate(texts)]
    assert 0 < sum(len(tok.encode(t, add_special_tokens=False)) for t in expected) < 3 * 2048

    # the mix config as DATA: what the run held out of each row
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(run)]), "--data", corpus_config, "--context",
                      64, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr
    saved = _saved_on(tmp_path / "eval", "streamed", corpus_config)
    assert saved["kind"] == "config"
    assert saved["tokens"] == sum(len(tok.encode(t, add_special_tokens=False)) for t in expected)
    assert saved["bytes"] == sum(len(t.encode("utf-8")) for t in expected)
    # DATA not given: the run's own validation blocks (its VAL_TOKENS), not every row behind them
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(run)]), "--context", 64, "--eval_dir",
                      tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr
    blocks = np.load(run / "val_blocks.npy")
    assert blocks.size == 2048
    saved = _saved_on(tmp_path / "eval", "streamed", run / "val_blocks.npy")
    assert saved["kind"] == "blocks"
    from sparknet.model.metrics import token_byte_lengths

    assert abs(saved["bytes"] - int(token_byte_lengths(tok)[blocks.reshape(-1)].sum())) <= 3  # the last cut character
    assert abs(saved["tokens"] - (blocks.size - int((blocks == tok.eos_token_id).sum()))) < 0.02 * blocks.size

    # a model with no record of this config's hold-out: HOLDOUT_ROWS says how many rows, else a clear error
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data", corpus_config,
                      "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "HOLDOUT_ROWS" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data", corpus_config,
                      "--holdout_rows", 3, "--context", 16, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr
    three = [t for spec in mix for t in _first_rows(Path(spec.data_files), 3)]
    assert _saved(tmp_path / "eval", "randrun")["bytes"] == sum(len(t.encode("utf-8")) for t in three)


@pytest.mark.slow
def test_one_table_scores_every_model_on_the_same_text_unless_told(tiny_dataset: Path, random_model: Path,
                                                                   tmp_path: Path) -> None:
    """A packed run and a run trained on other data, no DATA: both are scored on the first run's held-out split
    (with a warning for the other, which trained on one of its sources), so the table compares like with like;
    DATA=own scores each on its own data and the table says that its rows do not compare."""
    packed, other = tmp_path / "checkpoints" / "packed", tmp_path / "checkpoints" / "other"
    code = json.loads((tiny_dataset / "manifest.json").read_text())["inputs"]["mix"][1]
    for folder, data in ((packed, tiny_dataset), (other, tmp_path / "elsewhere")):
        shutil.copytree(random_model, folder)
        (folder / "training_metadata.json").write_text(json.dumps({"dataset": {"path": str(data)},
                                                                   "config": {"mix": [code]}}))
    (tmp_path / "elsewhere").mkdir()  # the other run's dataset: never opened when both score the packed split
    models = json.dumps([str(packed), str(other)])
    proc = run_script("eval_perplexity.py", "--models", models, "--context", 32, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"every model is scored on {tiny_dataset}, the held-out data of {packed}" in proc.stderr
    assert f"{other} may have trained on up to " in proc.stderr and "(code.train.jsonl)" in proc.stderr
    assert f"{packed} may have trained" not in proc.stderr
    lines = proc.stdout.strip().splitlines()
    # the whole-text rows (each dataset's per-source rows, "DATA [label]", follow its row)
    table = [line for line in lines if line.startswith(str(tmp_path)) and " [" not in line]
    assert len(table) == 2 and all(str(tiny_dataset) in line for line in table)
    assert len({line.split()[2:4] == table[0].split()[2:4] for line in table}) == 1  # same tokens and bytes
    header = lines[0]
    for name in ("tokens", "bytes", "bits/byte"):  # number columns end where their headers end
        assert {line.rindex(cell) + len(cell) for line in table for cell in [line.split()[header.split().index(
            name)]]} == {header.index(name) + len(name)}, name
    assert "note:" not in proc.stdout

    write_jsonl(tmp_path / "elsewhere" / "x.jsonl", TEXTS)
    (other / "training_metadata.json").write_text(json.dumps({"dataset": {"path": str(tmp_path / "x.jsonl")}}))
    write_jsonl(tmp_path / "x.jsonl", TEXTS)
    proc = run_script("eval_perplexity.py", "--models", models, "--data", "own", "--context", 32, "--eval_dir",
                      tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "these rows were scored on different data" in proc.stdout
    assert "do not compare" in (tmp_path / "eval" / "packed_vs_other" / "perplexity.md").read_text()


def test_a_damaged_results_file_stops_before_the_work_and_results_are_never_dropped(random_model: Path,
                                                                                     tmp_path: Path) -> None:
    from sparknet.eval.reports import merge_json

    data = write_jsonl(tmp_path / "val.jsonl", TEXTS)
    results = tmp_path / "eval" / "randrun" / "perplexity.json"
    results.parent.mkdir(parents=True)
    results.write_text('{"earlier": {"nll": 1.0')  # cut short
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data", data,
                      "--context", 16, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{results} is damaged" in proc.stderr and "windows" not in proc.stderr  # nothing was scored
    # damaged between the check and the write (another process): the new results are kept, the old file set aside
    merge_json(results, "new", {"nll": 2.0})
    assert json.loads(results.read_text()) == {"new": {"nll": 2.0}}
    assert (results.parent / "perplexity.json.damaged").read_text() == '{"earlier": {"nll": 1.0'
    # a file from before results were kept per setting (keyed by data, no documents): refused before the work
    results.write_text(json.dumps({"val.jsonl": {"data": "val.jsonl", "nll": 1.0, "tokens": 10}}))
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data", data,
                      "--context", 16, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{results}: the result 'val.jsonl' does not record its documents" in proc.stderr
    assert "windows" not in proc.stderr


@pytest.mark.slow
def test_the_runs_own_dataset_rebuilt_with_other_inputs_is_refused(corpus_config: Path, tokenizer_dir: Path,
                                                                    random_model: Path, tmp_path: Path) -> None:
    from sparknet.config.mix import load_config
    from sparknet.data.packed.build import BuildSpec, build_dataset

    def build(seed: int) -> dict:
        return build_dataset(BuildSpec(config=load_config(corpus_config), tokenizer=str(tokenizer_dir),
                                       output_dir=tmp_path / "ds", target_tokens=20_000, val_tokens=2_000,
                                       block_size=128, seed=seed, num_workers=0, overwrite=True))

    manifest = build(0)
    run = tmp_path / "checkpoints" / "packed"
    shutil.copytree(random_model, run)
    (run / "training_metadata.json").write_text(json.dumps(
        {"dataset": {"path": str(tmp_path / "ds"), "inputs": manifest["inputs"]}}))
    args = ["--models", json.dumps([str(run)]), "--context", 32, "--eval_dir", tmp_path / "eval"]
    assert run_script("eval_perplexity.py", *args).returncode == 0
    build(7)  # `build_dataset_v5.py --overwrite true --seed 7` into the run's dataset folder
    proc = run_script("eval_perplexity.py", *args)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "was rebuilt since packed was trained on it (seed: 0 -> 7)" in proc.stderr, proc.stderr[-2000:]


def test_token_ids_beyond_the_vocabulary_are_one_line(tiny_dataset: Path, random_model: Path,
                                                      tmp_path: Path) -> None:
    import numpy as np

    damaged = tmp_path / "ds"
    shutil.copytree(tiny_dataset, damaged)
    tokens = np.memmap(damaged / "val.bin", dtype=np.uint16, mode="r+")
    tokens[100] = 60_000  # the right size, a wrong byte
    tokens.flush()
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data", damaged,
                      "--context", 32, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "val.bin holds token id 60000" in proc.stderr and "outside the tokenizer's vocabulary" in proc.stderr


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_a_damaged_hold_out_file_of_a_streaming_run_is_one_line(how: str, corpus_config: Path, random_model: Path,
                                                                 tmp_path: Path) -> None:
    """A streaming run's val_blocks.npy (DATA) or val_report.json (a mix config as DATA) cut short or overwritten:
    one line naming the file and the fix, not numpy's or json's exception."""
    from sparknet.common.errors import UserError
    from sparknet.config.mix import load_config
    from sparknet.eval.data import DataRequest, load_documents
    from sparknet.run_files import RUN_CONFIG, VAL_BLOCKS, VAL_REPORT

    run = tmp_path / "ckpt" / "streamed"
    shutil.copytree(random_model, run)
    (run / RUN_CONFIG).write_text(json.dumps({"format_version": 2, "data": "stream",
                                              "mix": load_config(corpus_config).to_dict()["mix"]}))
    np.save(run / VAL_BLOCKS, np.arange(256, dtype=np.uint16).reshape(2, 128))
    held = {"prose": {"rows": 3, "rests": {}}, "code": {"rows": 3, "rests": {"1": 5}}}
    (run / VAL_REPORT).write_text(json.dumps({"blocks": 2, "rows_held_out": {"prose": 3, "code": 3}, "held_out": held,
                                              "commits": {}, "source_labels": ["prose", "code"]}))
    assert load_documents(DataRequest(str(run / VAL_BLOCKS))) and load_documents(
        DataRequest(str(corpus_config), runs=[run], max_documents=2))  # whole, both read
    for name in (VAL_BLOCKS, VAL_REPORT):
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[: len(data) // 2] if how == "truncated" else b"\x00garbage\xff" * 8)
    with pytest.raises(UserError, match=rf"{VAL_REPORT} is damaged .*restore it from a backup"):
        load_documents(DataRequest(str(corpus_config), runs=[run]))
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--data", run / VAL_BLOCKS,
                      "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{run / VAL_BLOCKS} is damaged" in lines[0] and "from a backup" in lines[0], \
        proc.stderr[-3000:]


def test_a_checkpoint_rotated_away_is_a_missing_folder_never_a_hub_id(random_model: Path, tmp_path: Path) -> None:
    """A checkpoint-N that SAVE_TOTAL_LIMIT removes while evaluation runs (after it was resolved) or before: one line
    saying the folder no longer exists, not the Hub's 'Repo id must be in the form ...' for its path."""
    from sparknet.common.errors import UserError
    from sparknet.common.runtime import PROJECT_ROOT

    run = tmp_path / "checkpoints" / "run"
    for step in (40, 48):
        shutil.copytree(random_model, run / f"checkpoint-{step}")
    ref = resolve_model(str(run / "checkpoint-40"))
    shutil.rmtree(run / "checkpoint-40")  # a running training's rotation, between resolving and loading
    with pytest.raises(UserError, match=r"checkpoint-40 no longer exists \(a running training's SAVE_TOTAL_LIMIT "
                                        r"removes old checkpoints; run holds checkpoint-48\): evaluate the run "
                                        "folder or a newer checkpoint"):
        load_model(ref, device="cpu")
    with pytest.raises(UserError, match=r"checkpoint-40 no longer exists .*SAVE_TOTAL_LIMIT.*holds checkpoint-48"):
        resolve_model(str(run / "checkpoint-40"))
    relative = str((run / "checkpoint-40").relative_to(tmp_path.parent))  # its first folder is not in the project
    assert not (PROJECT_ROOT / relative.split("/")[0]).exists()
    with pytest.raises(UserError, match="checkpoint-40 no longer exists|not found"):
        resolve_model(relative)
    assert resolve_model("openai-community/gpt2").folder is None  # a Hub id stays one
    typo = tmp_path / "checkpoint" / "run" / "checkpoint-40"  # no run folder at all: a typo, never "rotated away"
    with pytest.raises(UserError, match=r"checkpoint-40 not found, nor its run folder .*checkpoint/run: pass") as exc:
        resolve_model(str(typo))
    assert "no longer exists" not in str(exc.value)
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(run / "checkpoint-40")]), "--data",
                      "x.jsonl", "--eval_dir", tmp_path / "eval")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "checkpoint-40 no longer exists" in lines[0], proc.stderr


@pytest.mark.slow
def test_a_partial_evaluation_is_kept_beside_the_full_one_and_the_card_shows_the_full_one(random_model: Path,
                                                                                         tmp_path: Path) -> None:
    """`--max_documents 2` after a full evaluation of the same data: both results are kept (one per setting), the
    full one unchanged, and the exported card shows the full one with what it was computed on (documents,
    tokens), not the partial one."""
    from sparknet.export import export_model

    texts = [*TEXTS, *(f"Another document, number {i}, with a few words of its own." for i in range(5))]
    data = write_jsonl(tmp_path / "val.jsonl", texts)
    args = ["--models", json.dumps([str(random_model)]), "--data", data, "--context", 16, "--eval_dir",
            tmp_path / "eval"]
    assert run_script("eval_perplexity.py", *args).returncode == 0
    results = tmp_path / "eval" / "randrun" / "perplexity.json"
    (full,) = json.loads(results.read_text()).values()
    assert full["documents"] == len(texts)
    proc = run_script("eval_perplexity.py", *args, "--max_documents", 2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kept = list(json.loads(results.read_text()).values())
    assert len(kept) == 2 and full in kept, kept  # the full result as it was, beside the partial one
    (partial,) = [row for row in kept if row != full]
    assert partial["documents"] == 2 and partial["tokens"] < full["tokens"]
    assert "the card shows the fuller result" in proc.stderr, proc.stderr[-2000:]
    card = export_model(str(random_model), tmp_path / "exported", eval_root=str(tmp_path / "eval")).read_text()
    evaluation = card.split("## Evaluation")[1].split("##")[0]
    assert f"| {len(texts)} | {full['tokens']:,} |" in evaluation, evaluation  # documents, tokens
    assert f"{full['bits_per_byte']:.4f}" in evaluation and f"{partial['bits_per_byte']:.4f}" not in evaluation


def _scores_line(stdout: str, data: Path) -> list[str]:
    """The printed table's row of `data`: its cells."""
    (row,) = [line.split() for line in stdout.splitlines() if str(data) in line and "[" not in line]
    return row


@pytest.mark.slow
def test_a_results_write_under_a_file_size_limit_prints_the_scores_and_keeps_the_old_results(
        random_model: Path, tmp_path: Path) -> None:
    """`ulimit -f` reached while the scores are written: they used to be lost in a traceback. Now the table of the
    scores computed is printed, the fault is one line naming the results file and what EFBIG means, the results
    written before are byte for byte as they were, and no temporary file is left."""
    from sparknet.eval.data import DataRequest
    from sparknet.eval.perplexity import evaluate_perplexity

    first, second = write_jsonl(tmp_path / "a.jsonl", TEXTS), write_jsonl(tmp_path / "b.jsonl", TEXTS[:2])
    args = ["--models", json.dumps([str(random_model)]), "--context", 16, "--eval_dir", tmp_path / "eval"]
    evaluate_perplexity([str(random_model)], DataRequest(str(first)), context=16, eval_root=str(tmp_path / "eval"))
    out = tmp_path / "eval" / "randrun"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc = run_script("eval_perplexity.py", *args, "--data", second, file_size_limit=16)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: cannot write {out / 'perplexity.json'}: File too large (EFBIG): "), proc.stderr[-3000:]
    assert "The perplexity results computed are printed above (saving them in " in errors[0]
    tokenizer = load_model(resolve_model(str(random_model)), device="cpu")[1]
    tokens = sum(len(ids) for ids in tokenizer(TEXTS[:2], add_special_tokens=False)["input_ids"])
    assert _scores_line(proc.stdout, second)[2:4] == ["2", f"{tokens:,}"], proc.stdout
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no .tmp either


@pytest.mark.slow
def test_a_results_file_that_cannot_be_written_saves_the_scores_elsewhere(random_model: Path,
                                                                          tmp_path: Path) -> None:
    """A folder where the results file should be (the fault any user, root included, can meet): one line naming it
    and what EISDIR means; the scores printed and saved as JSON in the temporary folder."""
    data = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    out = tmp_path / "eval" / "randrun"
    (out / "perplexity.json").mkdir(parents=True)
    (out / "perplexity.json" / "kept.txt").write_text("in the way")
    proc = run_script("eval_perplexity.py", "--models", json.dumps([str(random_model)]), "--context", 16,
                      "--eval_dir", tmp_path / "eval", "--data", data)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: cannot write {out / 'perplexity.json'}: Is a directory (EISDIR): a folder is in the way where a file "
        "should be: move it away. The perplexity results computed are printed above and saved in "), errors[0]
    saved = Path(errors[0].split("saved in ")[1].split(";")[0])
    try:
        (row,) = json.loads(saved.read_text())
    finally:
        saved.unlink()
    assert row["data"] == str(data) and row["documents"] == 3
    assert _scores_line(proc.stdout, data)[3] == f"{row['tokens']:,}"
    assert sorted(p.name for p in out.iterdir()) == ["perplexity.json"]  # no lock file left


@pytest.mark.slow
def test_a_mix_config_whose_local_file_changed_since_the_streaming_run_is_refused_naming_it(
        tokenizer_dir: Path, tmp_path: Path) -> None:
    """The rows a streaming run held out are counted from each source's start: after an edit of a source file they
    are other text (44,525 -> 44,635 tokens scored, with the same warning as when nothing changed). The run's
    run_config.json records each local file's sha256: an unchanged mix is scored without a warning, a changed file
    is refused in one line naming it."""
    from tests.helpers import stream_args, write_config

    words = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone".split()
    files = [write_jsonl(tmp_path / f"{name}.jsonl", [f"{name} {i} " + " ".join(words[(i + j) % 13] for j in range(40))
                                                      for i in range(300)]) for name in ("prose", "code")]
    config = write_config(tmp_path / "mix.json", [{"name": "json", "prob": 0.5, "data_files": str(path)}
                                                  for path in files], context_length=128)
    args = stream_args(tmp_path, config, tokenizer_dir, max_steps=2, eval_steps=2, save_steps=2, run_name="streamed")
    target = args.index("--target_tokens")
    proc = run_script("train_sparknet.py", *args[:target], *args[target + 2:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "ckpt" / "streamed"
    evaluate = ["--models", json.dumps([str(run)]), "--data", config, "--context", 64, "--eval_dir", tmp_path / "eval"]
    proc = run_script("eval_perplexity.py", *evaluate)
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr[-3000:]
    results = tmp_path / "eval" / "streamed" / "perplexity.json"
    before = results.read_bytes()
    lines = files[0].read_text().splitlines()
    files[0].write_text("\n".join(['{"text": "a new first document"}', *lines]) + "\n")
    proc = run_script("eval_perplexity.py", *evaluate)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: DATA={config}: source file {files[0]} changed (sha256 "), proc.stderr[-3000:]
    assert errors[0].endswith(f"since run streamed held its validation rows out of it: the rows at its start are "
                              f"other text now. Restore the file, or score the run's validation blocks "
                              f"({run / 'val_blocks.npy'}, the default DATA)")
    assert results.read_bytes() == before


def test_may_have_seen_is_said_only_of_documents_from_sources_the_model_trained_on(
        random_model: Path, tiny_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A model scored on data other than its own held-out data: a warning only where documents come from sources it
    trained on (its run's local files by sha256, even renamed), with how many; none for a file the user held out,
    and none for the run's own held-out data."""
    from sparknet.eval.data import DataRequest, load_labelled_documents
    from sparknet.eval.perplexity import evaluate_perplexity

    manifest = json.loads((tiny_dataset / "manifest.json").read_text())
    prose = manifest["inputs"]["mix"][0]
    run = tmp_path / "checkpoints" / "base"
    shutil.copytree(random_model, run)
    sha = manifest["inputs"]["local_files_sha256"][prose["data_files"]]
    (run / "training_metadata.json").write_text(json.dumps({"config": {"mix": [prose]}, "dataset": {
        "path": str(tmp_path / "base-ds"), "inputs": {"local_files_sha256": {prose["data_files"]: sha}}}}))
    held_out = write_jsonl(tmp_path / "held_out.jsonl", TEXTS)
    copy = tmp_path / "renamed.jsonl"  # the training file under another name: the same documents
    shutil.copy(prose["data_files"], copy)

    def warned(data: str, **request: object) -> str:
        caplog.clear()
        with caplog.at_level("WARNING", logger="sparknet"):
            evaluate_perplexity([str(run)], DataRequest(data, **request), context=16, eval_root=str(tmp_path / "e"))
        return caplog.text

    assert "may have trained on" not in warned(str(held_out))
    assert f"may have trained on up to 5 of the 5 documents of {copy}: they come from sources it was trained on " \
           f"(prose.train.jsonl)" in warned(str(copy), max_documents=5)
    # a packed dataset whose validation split mixes that source with another: its prose documents only
    texts, labels = load_labelled_documents(str(tiny_dataset))
    prose_documents = labels.count(prose["label"])
    assert 0 < prose_documents < len(texts)
    assert f"may have trained on up to {prose_documents} of the {len(texts)} documents of {tiny_dataset}: they " \
           "come from sources it was trained on (prose.train.jsonl)" in warned(str(tiny_dataset))
    # a streaming run scored on its own validation blocks, however the path is spelled: no warning
    blocks = np.fromfile(tiny_dataset / "val.bin", dtype=np.uint16).reshape(-1, 128)
    np.save(run / "val_blocks.npy", blocks)
    (run / "training_metadata.json").write_text(json.dumps({"config": {"mix": [prose]}}))
    (run / "run_config.json").write_text(json.dumps({"mix": [prose], "local_files_sha256": {prose["data_files"]: sha}}))
    assert "may have trained on" not in warned(f"{tmp_path}/checkpoints/./base/val_blocks.npy")
