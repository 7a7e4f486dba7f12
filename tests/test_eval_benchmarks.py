"""eval_benchmarks: the offline suite runs through lm-eval end to end; unknown tasks and Hub tasks offline are one
line."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sparknet.common.errors import UserError
from sparknet.common.runtime import PROJECT_ROOT
from sparknet.harness import SUITE_TASK, run_benchmarks, write_offline_suite
from tests.helpers import OFFLINE_ENV, run_script, write_jsonl
from tests.hub_server import HubServer

TEXTS = [f"Document {i} says that the number {i} is followed by {i + 1} and then by many other numbers in a row "
         f"until the end of the line, which comes after {i * 7} words or so in this text." for i in range(12)]
# Documents of short words in a seeded order, whose true continuations a random model picks now and then (in TEXTS
# a true continuation holds a number, which it never prefers): its accuracy says whether the scores are its own.
_WORDS = ("the river runs past an old mill where children played through long summers while their parents worked "
          "the fields and counted sheep").split()
_ORDER = random.Random(0)
WORD_TEXTS = [" ".join(_ORDER.choice(_WORDS) for _ in range(48)) for _ in range(12)]


def _choice_scores(model: Any, tokenizer: Any, context: str, choices: list[str]) -> list[float]:
    """Each choice's log-likelihood after `context`, computed here with plain transformers as lm-eval's
    multiple_choice task defines it: the summed log-probabilities of the tokens " " + choice adds to the context's,
    the input cut from the left to the model's context."""
    import torch

    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    scores = []
    for choice in choices:
        whole = tokenizer(f"{context} {choice}", add_special_tokens=False)["input_ids"]
        continuation = whole[len(context_ids):]
        inputs = torch.tensor([whole[-(model.config.n_positions + 1):][:-1]])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(inputs).logits[0, -len(continuation):].double(), dim=-1)
        scores.append(float(logprobs[torch.arange(len(continuation)), torch.tensor(continuation)].sum()))
    return scores


def _accuracy_bounds(scores: list[list[float]], labels: list[int], lengths: list[list[int]] | None = None,
                     tie: float = 1e-4) -> tuple[float, float]:
    """The accuracy of picking each item's highest score (divided by the choices' lengths in characters when
    given: acc_norm), as (lowest, highest): a choice within `tie` of the best may be picked either way, as float
    sums in another order can tip it."""
    sure = possible = 0
    for item, label in enumerate(labels):
        values = [v / (lengths[item][i] if lengths else 1) for i, v in enumerate(scores[item])]
        best = max(values)
        near = [i for i, v in enumerate(values) if v >= best - tie]
        sure += near == [label]
        possible += label in near
    return sure / len(labels), possible / len(labels)


def test_suite_items_are_valid_and_reproducible(tmp_path: Path) -> None:
    first = (write_offline_suite(TEXTS, tmp_path / "a", items=30, seed=3) / f"{SUITE_TASK}.jsonl").read_text()
    again = (write_offline_suite(TEXTS, tmp_path / "b", items=30, seed=3) / f"{SUITE_TASK}.jsonl").read_text()
    assert first == again
    for line in first.splitlines():
        item = json.loads(line)
        assert len(item["choices"]) == 4 and 0 <= item["label"] < 4
        true = item["context"] + " " + item["choices"][item["label"]]
        assert any(true in " ".join(text.split()) for text in TEXTS)  # the right answer continues a document
    with pytest.raises(UserError, match="needs at least 4 documents"):
        write_offline_suite(TEXTS[:2], tmp_path / "c")


@pytest.mark.slow
def test_offline_suite_through_lm_eval(random_model: Path, tmp_path: Path) -> None:
    """The script scores the suite's items with lm-eval and reports acc and acc_norm: each the accuracy that the
    model's own log-likelihoods of the choices give (computed here with plain transformers), with its standard
    error, and only SparkNet's lines on the console."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = write_jsonl(tmp_path / "val.jsonl", WORD_TEXTS)
    log = tmp_path / "benchmarks.log"  # its output redirected to a file, read back byte for byte (a captured text
    with log.open("wb") as out:  # stream would turn each carriage return into a newline)
        proc = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "eval_benchmarks.py"), "--models",
                               json.dumps([str(random_model)]), "--suite_data", str(data), "--suite_items", "12",
                               "--suite_dir", str(tmp_path / "suite"), "--eval_dir", str(tmp_path / "eval"),
                               "--batch_size", "4"], cwd=PROJECT_ROOT, env={**os.environ, **OFFLINE_ENV},
                              stdout=out, stderr=subprocess.STDOUT, timeout=300)
    output = log.read_bytes().decode()
    assert proc.returncode == 0, output[-3000:]
    scores = json.loads((tmp_path / "eval" / "randrun" / "benchmarks.json").read_text())["results"][SUITE_TASK]
    # the accuracies of this model on the suite's 12 items, from its own log-likelihoods of the choices
    items = [json.loads(line) for line in (tmp_path / "suite" / f"{SUITE_TASK}.jsonl").read_text().splitlines()]
    assert len(items) == 12
    model = AutoModelForCausalLM.from_pretrained(str(random_model)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(random_model))
    likelihoods = [_choice_scores(model, tokenizer, item["context"], item["choices"]) for item in items]
    labels = [item["label"] for item in items]
    low, high = _accuracy_bounds(likelihoods, labels)
    assert low <= scores["acc"] <= high and high > 0, (scores, low, high)
    low, high = _accuracy_bounds(likelihoods, labels, [[len(c) for c in item["choices"]] for item in items])
    assert low <= scores["acc_norm"] <= high, (scores, low, high)
    for metric in ("acc", "acc_norm"):  # the standard error of a mean of 12 zeros and ones
        p = scores[metric]
        assert scores[f"{metric}_stderr"] == pytest.approx((p * (1 - p) / (len(items) - 1)) ** 0.5), metric
    assert "| sparknet_continuation | acc |" in (tmp_path / "eval" / "randrun" / "benchmarks.md").read_text()
    # SparkNet's lines only: no lm-eval INFO lines, no advice about attention masks, no per-load or split bars
    for noise in ("INFO lm_eval", "attention_mask", "Loading weights", "Generating test split"):
        assert noise not in output, noise
    # captured, as in a log file: lm-eval's bars are whole lines, as SparkNet's own (sparknet.common.progress), not one
    # long line of carriage-return redraws
    assert "\r" not in output, repr(output[-2000:])
    assert any(line.startswith("Running loglikelihood requests: 100%") for line in output.splitlines()), output


@pytest.mark.slow
def test_unknown_and_hub_tasks(random_model: Path) -> None:
    """An unknown task name, and a Hub task offline, are one line each; the Hub task's line is said because the
    task's data could not be fetched offline (the error it stands for), not for any failure of lm-eval's run."""
    with pytest.raises(UserError, match="unknown task.*no_such_task"):
        run_benchmarks(str(random_model), str(random_model), ["no_such_task"])
    with pytest.raises(UserError, match="needs data from the Hub") as error:
        run_benchmarks(str(random_model), str(random_model), ["arc_easy"], limit=2)
    cause = error.value.__context__  # what run_benchmarks caught (raised `from None`: hidden, still recorded)
    assert isinstance(cause, ConnectionError), repr(cause)
    assert "ai2_arc" in str(cause) and "OfflineModeIsEnabled" in str(cause), repr(cause)


@pytest.mark.parametrize("script", ["eval_benchmarks.py", pytest.param("eval_perplexity.py", marks=pytest.mark.slow),
                                    pytest.param("eval_generation.py", marks=pytest.mark.slow)])
def test_a_mistyped_model_folder_or_an_unreachable_hub_model_is_one_line(script: str, random_model: Path,
                                                                         tmp_path: Path) -> None:
    import shutil
    import uuid

    # a project folder holding a run: "runs-x/dmeo" is a mistyped run folder, not the Hub user "runs-x"
    runs = PROJECT_ROOT / f"test-runs-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(random_model, runs / "demo")
        proc = run_script(script, "--models", json.dumps([f"{runs.name}/dmeo"]))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert f"model folder {runs.name}/dmeo not found" in proc.stderr and f"{runs.name}/ holds: demo" in proc.stderr
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    # any project folder ("scripts/") makes "scripts/x" a local path (sparknet.common.folder_or_hub), answered at once
    proc = run_script(script, "--models", json.dumps(["scripts/no-model"]), "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "model folder scripts/no-model not found" in proc.stderr and "scripts/ holds: no folders" in proc.stderr
    # a Hub id offline cannot load (eval_benchmarks refuses it before lm-eval starts; the others when they load it,
    # perplexity with text to score)
    extra = ["--data", write_jsonl(tmp_path / "val.jsonl", TEXTS)] if script == "eval_perplexity.py" else []
    for spec in ("no-such-user-sparknet/no-model",):
        proc = run_script(script, "--models", json.dumps([spec]), *extra, "--eval_dir", tmp_path / "eval")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert lines[-1].startswith(f"error: cannot load model '{spec}'"), proc.stderr[-3000:]
        assert "Hub ids need network access or a cached copy" in lines[-1]


@pytest.mark.slow  # lm-eval's import and run in a script for an edge case: the fast tier runs the suite above
def test_a_choice_longer_than_the_model_context_is_one_line(random_model: Path, tmp_path: Path) -> None:
    """lm-eval asserts that each answer choice fits the model's context: a choice of 8 long made-up words is more
    than the random model's 32 tokens, which is one line naming the model, the task and its context (no traceback,
    nothing written)."""
    rng = random.Random(1)
    words = ["".join(rng.choice("qxzjvkwy") for _ in range(24)) for _ in range(64)]
    texts = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(6)]
    proc = run_script("eval_benchmarks.py", "--models", json.dumps([str(random_model)]), "--suite_data",
                      write_jsonl(tmp_path / "val.jsonl", texts), "--suite_items", 4, "--suite_dir", tmp_path / "suite",
                      "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {random_model}: an answer choice of task(s) {SUITE_TASK} is longer than the "
                           "model's context of 32 tokens"), last
    assert not (tmp_path / "eval" / "randrun" / "benchmarks.json").exists()


@pytest.mark.slow
def test_a_limited_run_is_kept_beside_the_full_one_and_the_card_shows_the_full_one(random_model: Path,
                                                                                  tmp_path: Path) -> None:
    """`--limit 4` after the whole suite (12 items): both results are kept, `results` (the model-index) stays the
    12-item one, and the exported card shows it with its item count."""
    from huggingface_hub import ModelCard

    from sparknet.export import export_model

    data = write_jsonl(tmp_path / "val.jsonl", WORD_TEXTS)
    args = ["--models", json.dumps([str(random_model)]), "--suite_data", data, "--suite_items", 12, "--suite_dir",
            tmp_path / "suite", "--eval_dir", tmp_path / "eval", "--batch_size", 4]
    proc = run_script("eval_benchmarks.py", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = tmp_path / "eval" / "randrun" / "benchmarks.json"
    full = json.loads(path.read_text())["results"][SUITE_TASK]
    assert full["items"] == 12
    proc = run_script("eval_benchmarks.py", *args, "--limit", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads(path.read_text())
    assert saved["results"][SUITE_TASK] == full  # the fullest result stands
    assert sorted(entry["items"] for entry in saved["settings"].values()) == [4, 12]  # the limited one is kept
    card = export_model(str(random_model), tmp_path / "exported", eval_root=str(tmp_path / "eval"))
    benchmarks = card.read_text().split("## Benchmarks")[1].split("##")[0]
    assert f"| {SUITE_TASK} | 12 | {full['shots']} | {full['acc']:.4f} |" in benchmarks, benchmarks
    index = {result.metric_type: result.metric_value for result in ModelCard.load(card).data.eval_results}
    assert index == {"acc": full["acc"], "acc_norm": full["acc_norm"]}  # the scores only, of the full run


def test_a_model_path_under_a_local_folder_is_answered_at_once(hub: HubServer, tmp_path: Path) -> None:
    """`--models models/mine`, typed where models/ exists (holding no model yet) but mine does not: one line naming
    the folder looked for and what models/ holds, at once; online (through the loopback Hub), never a Hub lookup."""
    from tests.helpers import run_where_a_local_folder_is

    (tmp_path / "models" / "notes").mkdir(parents=True)
    lines, seconds = run_where_a_local_folder_is(hub, tmp_path, "eval_benchmarks.py", "--models",
                                                 json.dumps(["models/mine"]), "--eval_dir", tmp_path / "eval")
    assert lines[0].startswith("error: model folder models/mine not found"), lines[0]
    assert f"looked for {tmp_path / 'models' / 'mine'}" in lines[0] and "models/ holds: notes" in lines[0]
    assert not hub.requests, hub.requests  # not one Hub lookup (a real Hub's retries took ~50 s to fail)
    assert seconds < 60, seconds
