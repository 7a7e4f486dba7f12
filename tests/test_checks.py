"""The constants' rules (sparknet.config.checks): every numeric constant of every script has one, and a bad value stops
a script at once, before the slow imports and before any data is opened."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sparknet.common.runtime import PROJECT_ROOT
from sparknet.config.checks import RULES, problems
from sparknet.config.cli import annotated_types, is_path_constant, script_constants
from tests.helpers import OFFLINE_ENV, run_script

SCRIPTS = sorted(p.name for p in (PROJECT_ROOT / "scripts").glob("*.py"))
# constants whose values are free text or names checked where they are used (a split, a column, a licence id, the
# Hub repo to push to, lm-eval task names, run names, prompts): no rule, on purpose
FREE_TEXT = {"LANGUAGE", "LICENSE", "PROMPTS", "PUSH_TO_HUB", "RUNS", "SAMPLE_PROMPTS", "SPLIT", "SUBSET", "TASKS",
             "TEXT_FIELD"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_numeric_and_choice_constant_has_a_rule(script: str) -> None:
    """Every constant is a flag (bool), a path, free text (FREE_TEXT), or has a rule: a new choice constant without
    a rule fails here."""
    constants = script_constants(script)
    typed = annotated_types((PROJECT_ROOT / "scripts" / script).read_text())
    for name, value in constants.items():
        kind = typed.get(name, value)
        ruled = name in RULES or isinstance(kind, bool) or is_path_constant(name) or name in FREE_TEXT
        assert ruled, f"{script}: {name} has no rule in sparknet.config.checks.RULES (nor is it a path or free text)"
        if name in RULES:
            assert not problems({name: value}), f"{script}: the default {name}={value!r} breaks its own rule"


@pytest.mark.parametrize(("script", "args", "message"), [
    # the names the registry holds (sparknet.model.optimizers.OPTIMIZERS, tests/test_optim.py)
    ("train_sparknet_v5.py", ["--optimizer", "sgd"], f"OPTIMIZER='sgd': expected {RULES['OPTIMIZER'].expected}"),
    ("train_sparknet_v5.py", ["--model_preset", "sparknet-small"], "(did you mean sparknet-"),
    ("train_sparknet.py", ["--warmup_ratio", "1.5"], "WARMUP_RATIO=1.5: expected a fraction in [0, 1)"),
    ("eval_perplexity.py", ["--batch_size", "-4"], "BATCH_SIZE=-4: expected a positive integer"),
    ("eval_perplexity.py", ["--batch_size", "0"], "BATCH_SIZE=0: expected a positive integer"),
    ("eval_benchmarks.py", ["--batch_size", "-2", "--limit", "-1"],
     "LIMIT=-1: expected an integer >= 0 (0: every item); BATCH_SIZE=-2: expected a positive integer"),
    ("build_dataset_v5.py", ["--num_workers", "-1"], "NUM_WORKERS=-1: expected an integer >= 0"),
    ("eval_generation.py", ["--top_p", "0"], "TOP_P=0.0: expected in (0, 1]"),
    ("train_tokenizer_v5.py", ["--vocab_size", "100"], "VOCAB_SIZE=100: expected 257 or more"),
    ("prepare_demo_corpus.py", ["--val_percent", "0"], "VAL_PERCENT=0: expected a percentage in (0, 100)"),
    ("demo.py", ["--train_tokens", "0", "--save_steps", "75"],
     "TRAIN_TOKENS=0: expected a positive integer; SAVE_STEPS=75 must be a multiple of EVAL_STEPS=50"),
])
def test_a_bad_value_stops_the_script_before_imports_and_data(script: str, args: list[str], message: str) -> None:
    # a dataset folder and a config that do not exist: the constant's error must come first
    missing = ["--dataset_dir", "datasets/no-such-dataset"] if script == "train_sparknet_v5.py" else []
    proc = subprocess.run([sys.executable, "-X", "importtime", f"scripts/{script}", *args, *missing],
                          cwd=PROJECT_ROOT, env={**OFFLINE_ENV, "PATH": "/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "transformers", "datasets", "numpy"}, imported & {"torch", "transformers"}


def test_the_documented_example_is_what_a_script_prints() -> None:
    """docs/scripts.md shows a refused command's line (the optimizers named in it from the registry): it is the
    line the script prints."""
    import re

    doc = (PROJECT_ROOT / "docs" / "scripts.md").read_text()
    example = re.search(r"`(error: OPTIMIZER='sgd': [^`]*)`", doc)
    assert example, "docs/scripts.md: no example error line"
    proc = run_script("train_sparknet_v5.py", "--optimizer", "sgd", "--warmup_ratio", 1.5, "--dataset_dir",
                      "datasets/no-such-dataset")
    assert example.group(1) in proc.stderr.splitlines(), proc.stderr[-2000:]
