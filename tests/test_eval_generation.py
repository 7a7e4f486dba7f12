"""eval_generation: a fixed seed gives the same text, whatever ran before; several models in one report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparknet.errors import UserError
from sparknet.eval.generation import SamplingSettings, generate_samples, load_prompts
from sparknet.eval.models import load_model, resolve_model
from tests.conftest import run_script
from tests.test_eval_perplexity import random_model  # noqa: F401 - the module-scoped fixture, shared

SETTINGS = SamplingSettings(temperature=1.0, top_p=0.95, top_k=0, max_new_tokens=12, num_samples=2, seed=7)


def test_fixed_seed_gives_the_same_text(random_model: Path) -> None:  # noqa: F811
    import torch

    model, tok, _ = load_model(resolve_model(str(random_model)), device="cpu")
    first = generate_samples(model, tok, ["The ", "def "], SETTINGS)
    torch.manual_seed(999)  # whatever the global RNG did in between
    again = generate_samples(model, tok, ["def "], SETTINGS)
    assert again[0] == first[1]
    assert first[0][0] != first[0][1]  # two different samples of one prompt
    other_seed = generate_samples(model, tok, ["def "], SamplingSettings(**{**vars(SETTINGS), "seed": 8}))
    assert other_seed[0] != first[1]


def test_script_report_side_by_side(random_model: Path, tmp_path: Path) -> None:  # noqa: F811
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello\n\ndef f(x):\\n    return\n")
    second = tmp_path / "other"
    second.symlink_to(random_model)
    args = ["--models", json.dumps([str(random_model), str(second)]), "--prompts_file", prompts, "--max_new_tokens", 8,
            "--eval_dir", tmp_path / "eval"]
    proc = run_script("eval_generation.py", *args)
    assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "eval" / "randrun_vs_other" / "generation.md").read_text()
    assert report.count("## Prompt") == 2 and "def f(x):\n    return" in report
    assert f"| # | {random_model} | {second} |" in report
    rows = [line for line in report.splitlines() if line.startswith("| 1 |")]
    cells = rows[0].split(" | ")
    assert cells[1] == cells[2].rstrip(" |")  # the same weights and seed: the same text in both columns
    with pytest.raises(UserError, match="prompts file .*nope.txt not found"):
        load_prompts(["unused"], str(tmp_path / "nope.txt"))


@pytest.mark.parametrize(("flag", "value"), [("temperature", -1), ("top_p", 5), ("num_samples", 0),
                                             ("max_new_tokens", 0)])
def test_out_of_range_sampling_settings_are_one_line(flag: str, value: float, random_model: Path) -> None:  # noqa: F811
    proc = run_script("eval_generation.py", "--models", json.dumps([str(random_model)]), f"--{flag}", value)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"{flag.upper()}={value}" in proc.stderr and ": expected" in proc.stderr


def test_a_prompt_longer_than_the_context_keeps_its_end(random_model: Path, tmp_path: Path) -> None:  # noqa: F811
    prompts = tmp_path / "long.txt"
    prompts.write_text("the quick brown fox jumps over the lazy dog " * 20 + "\n")  # far more than 32 tokens
    proc = run_script("eval_generation.py", "--models", json.dumps([str(random_model)]), "--prompts_file", prompts,
                      "--max_new_tokens", 8, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "only its last 24 are used (the model's context is 32, 8 of them for new tokens)" in proc.stderr
    proc = run_script("eval_generation.py", "--models", json.dumps([str(random_model)]), "--max_new_tokens", 32,
                      "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "MAX_NEW_TOKENS=32 leaves no room for a prompt in the model's context of 32 tokens" in proc.stderr
