"""eval_generation: a fixed seed gives the same text, whatever ran before, and no two samples the same draws;
several models in one report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sparknet.common.errors import UserError
from sparknet.eval.generation import SamplingSettings, generate_samples, load_prompts, sample_seed
from sparknet.eval.models import load_model, resolve_model
from tests.helpers import random_run_folder, run_script

SETTINGS = SamplingSettings(temperature=1.0, top_p=0.95, top_k=0, max_new_tokens=12, num_samples=2, seed=7)


def _prompt_ids(model_dir: Path, prompt: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))(prompt, add_special_tokens=False)["input_ids"]


def _generated(model_dir: Path, prompt_ids: list[int], prompt_index: int, settings: SamplingSettings) -> list[str]:
    """What plain transformers generates after `prompt_ids` with `settings` (each sample after setting its seed,
    `sample_seed` of the prompt's place and the sample's number; greedy, one sample, at temperature 0), the
    generated text only: the reference a report is checked against."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    options: dict = dict(do_sample=False)
    if settings.temperature > 0:
        options = dict(do_sample=True, temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)
    ids = torch.tensor([prompt_ids])
    texts = []
    for number in range(settings.num_samples if settings.temperature > 0 else 1):
        set_seed(sample_seed(settings.seed, prompt_index, number))
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=settings.max_new_tokens,
                                 repetition_penalty=settings.repetition_penalty, pad_token_id=tokenizer.eos_token_id,
                                 **options)
        texts.append(tokenizer.decode(out[0][len(prompt_ids):], skip_special_tokens=True))
    return texts


def _report_samples(report: str, prompts: list[str], models: int) -> list[list[list[str]]]:
    """generation.md read back: per prompt, per model (column), its samples, with the prompt taken off each cell
    and the table's escapes (<br> for a newline, \\| for |) undone."""
    sections = report.split("## Prompt ")[1:]
    assert len(sections) == len(prompts), report
    out = []
    for section, prompt in zip(sections, prompts, strict=True):
        columns: list[list[str]] = [[] for _ in range(models)]
        for row in (line for line in section.splitlines() if re.match(r"\| \d+ \| ", line)):
            cells = row[:-len(" |")].split(" | ")[1:]
            assert len(cells) == models, row
            for column, cell in zip(columns, cells, strict=True):
                text = re.sub(r"\\+\|", "|", cell).replace("<br>", "\n")
                assert text.startswith(f"**{prompt}**"), (cell, prompt)
                column.append(text[len(f"**{prompt}**"):])
        out.append(columns)
    return out


def test_fixed_seed_gives_the_same_text(random_model: Path) -> None:
    import torch

    model, tok, _ = load_model(resolve_model(str(random_model)), device="cpu")
    first = generate_samples(model, tok, ["The ", "def "], SETTINGS)
    torch.manual_seed(999)  # whatever the global RNG did in between
    again = generate_samples(model, tok, ["The ", "def "], SETTINGS)
    assert again == first
    assert first[0][0] != first[0][1]  # two different samples of one prompt
    other_seed = generate_samples(model, tok, ["The ", "def "], SamplingSettings(**{**vars(SETTINGS), "seed": 8}))
    assert other_seed[1] != first[1]


def test_samples_of_different_prompts_are_different_draws_and_repeat_run_to_run(random_model: Path) -> None:
    """Each sample has a seed of its own (from SEED, its prompt's index and its number): two prompts never share
    their random draws (with the seed set again per prompt, the second sample of two prompts was the same
    continuation; here one prompt given twice shows it), and the same call gives the same text."""
    import torch

    model, tok, _ = load_model(resolve_model(str(random_model)), device="cpu")
    twice = generate_samples(model, tok, ["The ", "The "], SETTINGS)
    assert all(twice[0][number] != twice[1][number] for number in range(SETTINGS.num_samples)), twice
    different = generate_samples(model, tok, ["The ", "def "], SETTINGS)
    assert len({text for samples in different for text in samples}) == 4, different
    torch.manual_seed(999)  # whatever the global RNG did in between
    assert generate_samples(model, tok, ["The ", "def "], SETTINGS) == different
    assert generate_samples(model, tok, ["The ", "The "], SETTINGS) == twice


def test_script_report_side_by_side(random_model: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    """Two models with different weights, one column each: each column holds what its own model generates with
    the report's settings (plain transformers, the same seed), so the columns differ."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello\n\ndef f(x):\\n    return\n")
    second = random_run_folder(tokenizer_dir, tmp_path / "other", seed=1)
    settings = SamplingSettings(temperature=0.8, top_p=0.95, top_k=50, max_new_tokens=8, num_samples=2, seed=1234)
    args = ["--models", json.dumps([str(random_model), str(second)]), "--prompts_file", prompts, "--eval_dir",
            tmp_path / "eval", *(a for name, value in vars(settings).items() for a in (f"--{name}", value))]
    proc = run_script("eval_generation.py", *args)
    assert proc.returncode == 0, proc.stderr
    for model in (random_model, second):  # each model's line says its compute threads (issue 52)
        assert re.search(rf"{re.escape(str(model))} on cpu, \d+ compute threads? \(", proc.stderr), proc.stderr
    report = (tmp_path / "eval" / "randrun_vs_other" / "generation.md").read_text()
    assert report.count("## Prompt") == 2 and "def f(x):\n    return" in report
    assert f"| # | {random_model} | {second} |" in report
    texts = ["Hello", "def f(x):\n    return"]
    for index, (prompt, (first, other)) in enumerate(zip(texts, _report_samples(report, texts, models=2),
                                                         strict=True)):
        assert first == _generated(random_model, _prompt_ids(random_model, prompt), index, settings), prompt
        assert other == _generated(second, _prompt_ids(second, prompt), index, settings), prompt
        assert first != other and len(first) == settings.num_samples, prompt
    with pytest.raises(UserError, match="prompts file .*nope.txt not found"):
        load_prompts(["unused"], str(tmp_path / "nope.txt"))


@pytest.mark.parametrize(("flag", "value"), [("temperature", -1), ("top_p", 5), ("num_samples", 0),
                                             ("max_new_tokens", 0)])
def test_out_of_range_sampling_settings_are_one_line(flag: str, value: float, random_model: Path) -> None:
    proc = run_script("eval_generation.py", "--models", json.dumps([str(random_model)]), f"--{flag}", value)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"{flag.upper()}={value}" in proc.stderr and ": expected" in proc.stderr


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_keeps_its_end(random_model: Path, tmp_path: Path) -> None:
    """The model sees the prompt's last tokens (its context less MAX_NEW_TOKENS), not its first: the greedy
    continuation is plain transformers' after those last tokens, which is not its continuation of the first."""
    prompt = " ".join(str(n) for n in range(100, 160)) + " and the end of the prompt"  # far more than 32 tokens
    prompts = tmp_path / "long.txt"
    prompts.write_text(prompt + "\n")
    proc = run_script("eval_generation.py", "--models", json.dumps([str(random_model)]), "--prompts_file", prompts,
                      "--max_new_tokens", 8, "--temperature", 0, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "only its last 24 are used (the model's context is 32, 8 of them for new tokens)" in proc.stderr
    ids = _prompt_ids(random_model, prompt)
    assert len(ids) > 2 * 24
    greedy = SamplingSettings(temperature=0, max_new_tokens=8, num_samples=1)
    end, start = _generated(random_model, ids[-24:], 0, greedy), _generated(random_model, ids[:24], 0, greedy)
    assert end != start  # else this random model could not tell which end was kept
    assert end not in (_generated(random_model, ids[-25:-1], 0, greedy), _generated(random_model, ids[-23:], 0, greedy))
    report = (tmp_path / "eval" / "randrun" / "generation.md").read_text()
    assert _report_samples(report, [prompt], models=1) == [[end]]
    proc = run_script("eval_generation.py", "--models", json.dumps([str(random_model)]), "--max_new_tokens", 32,
                      "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "MAX_NEW_TOKENS=32 leaves no room for a prompt in the model's context of 32 tokens" in proc.stderr


def test_report_cells_escape_a_pipe_once() -> None:
    """A sample holding `|` (shell pipes, tables in code) stays in its cell: escaped once as `\\|` (twice, `\\\\|`,
    is a literal backslash and a pipe that splits the row), newlines as <br>."""
    from sparknet.eval.generation import SamplingSettings, generation_report

    report = generation_report(["a", "b"], ["ls |"], [[["x | y\nz"]], [["w"]]], SamplingSettings(num_samples=1))
    row = next(line for line in report.splitlines() if line.startswith("| 1 |"))
    assert row == "| 1 | **ls \\|**x \\| y<br>z | **ls \\|**w |", row
    assert row.replace("\\|", "").count("|") == 4  # the row's own separators: three columns


def test_a_report_that_cannot_be_written_is_one_line_after_the_report_is_printed(random_model: Path,
                                                                                 tmp_path: Path) -> None:
    """A folder where generation.md should be (a write fault any user, root included, can meet; issue 41.4): one
    line naming the path and what EISDIR means, no traceback, and the samples generated are printed before it, so
    nothing computed is lost; no temporary file is left beside it."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello\n")
    out = tmp_path / "eval" / "randrun"
    (out / "generation.md").mkdir(parents=True)
    proc = run_script("eval_generation.py", "--models", json.dumps([str(random_model)]), "--prompts_file", prompts,
                      "--max_new_tokens", 8, "--num_samples", 1, "--eval_dir", tmp_path / "eval")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: cannot write {out / 'generation.md'}: Is a directory (EISDIR)"), errors
    assert "## Prompt" in proc.stdout and "Hello" in proc.stdout  # the report, printed before the write
    assert sorted(p.name for p in out.iterdir()) == ["generation.md"]
