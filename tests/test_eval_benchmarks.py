"""eval_benchmarks: the offline suite runs through lm-eval end to end; unknown tasks and Hub tasks offline are one
line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparknet.errors import UserError
from sparknet.eval.benchmarks import SUITE_TASK, run_benchmarks, write_offline_suite
from tests.conftest import run_script, write_jsonl
from tests.test_eval_perplexity import random_model  # noqa: F401 - the module-scoped fixture, shared

TEXTS = [f"Document {i} says that the number {i} is followed by {i + 1} and then by many other numbers in a row "
         f"until the end of the line, which comes after {i * 7} words or so in this text." for i in range(12)]


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


def test_offline_suite_through_lm_eval(random_model: Path, tmp_path: Path) -> None:  # noqa: F811
    data = write_jsonl(tmp_path / "val.jsonl", TEXTS)
    proc = run_script("eval_benchmarks.py", "--models", json.dumps([str(random_model)]), "--suite_data", data,
                      "--suite_items", 12, "--suite_dir", tmp_path / "suite", "--eval_dir", tmp_path / "eval",
                      "--batch_size", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = json.loads((tmp_path / "eval" / "randrun" / "benchmarks.json").read_text())["results"][SUITE_TASK]
    assert 0 <= scores["acc"] <= 1 and 0 <= scores["acc_norm"] <= 1 and scores["acc_stderr"] >= 0
    assert "| sparknet_continuation | acc |" in (tmp_path / "eval" / "randrun" / "benchmarks.md").read_text()
    # SparkNet's lines only: no lm-eval INFO lines, no advice about attention masks, no per-load or split bars
    output = proc.stdout + proc.stderr
    for noise in ("INFO lm_eval", "attention_mask", "Loading weights", "Generating test split"):
        assert noise not in output, noise


def test_unknown_and_hub_tasks(random_model: Path) -> None:  # noqa: F811
    with pytest.raises(UserError, match="unknown task.*no_such_task"):
        run_benchmarks(str(random_model), str(random_model), ["no_such_task"])
    with pytest.raises(UserError, match="needs data from the Hub"):
        run_benchmarks(str(random_model), str(random_model), ["arc_easy"], limit=2)


@pytest.mark.parametrize("script", ["eval_benchmarks.py", "eval_perplexity.py", "eval_generation.py"])
def test_a_mistyped_model_folder_or_an_unreachable_hub_model_is_one_line(script: str, random_model: Path,  # noqa: F811
                                                                         ) -> None:
    import shutil
    import uuid

    from sparknet.runtime import PROJECT_ROOT

    # a project folder holding a run: "runs-x/dmeo" is a mistyped run folder, not the Hub user "runs-x"
    runs = PROJECT_ROOT / f"test-runs-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(random_model, runs / "demo")
        proc = run_script(script, "--models", json.dumps([f"{runs.name}/dmeo"]))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert f"model folder {runs.name}/dmeo not found" in proc.stderr and f"{runs.name}/ holds: demo" in proc.stderr
    finally:
        shutil.rmtree(runs, ignore_errors=True)
    # a project folder holding no runs ("scripts/") does not hide a Hub id "scripts/x"; offline it cannot load
    if script == "eval_benchmarks.py":  # refused before lm-eval starts
        for spec in ("no-such-user-sparknet/no-model", "scripts/no-model"):
            proc = run_script(script, "--models", json.dumps([spec]))
            assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
            assert f"cannot load model '{spec}'" in proc.stderr
