"""Samples from causal LMs: settings, prompts, seeded generation, and the side-by-side report
(scripts/eval_generation.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparknet.common.errors import UserError


@dataclass
class SamplingSettings:
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 50
    repetition_penalty: float = 1.0
    max_new_tokens: int = 64
    num_samples: int = 2
    seed: int = 1234

    def __post_init__(self) -> None:
        from sparknet.config.checks import check_values

        check_values({name.upper(): value for name, value in vars(self).items()})


def load_prompts(prompts: list[str], prompts_file: str = "") -> list[str]:
    """The prompts: one per line of `prompts_file` (blank lines skipped; `\\n` stands for a newline), else `prompts`."""
    from sparknet.common.runtime import project_path

    if prompts_file:
        path = project_path(prompts_file)
        if not path.is_file():
            raise UserError(f"prompts file {prompts_file} not found (looked for {path})")
        prompts = [line.replace("\\n", "\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise UserError("no prompts: set PROMPTS or PROMPTS_FILE")
    return prompts


def sample_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """The seed of one sample: derived from SEED, the prompt's place in the list and the sample's number, so that no
    two samples share their random draws (one seed per prompt gave two prompts the same draws, and often the same
    continuation) and a run gives the same text each time."""
    import numpy as np

    return int(np.random.SeedSequence([seed, prompt_index, sample_index]).generate_state(1)[0])


def generate_samples(model: Any, tokenizer: Any, prompts: list[str], settings: SamplingSettings) -> list[list[str]]:
    """`num_samples` continuations per prompt (the generated text only), each generated after setting its own seed
    (`sample_seed`): the samples depend only on the model, the prompts and the settings, not on what ran before."""
    from transformers import set_seed

    from sparknet.model.continuations import continuations

    sample = settings.temperature > 0
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    options = dict(max_new_tokens=settings.max_new_tokens, do_sample=sample, pad_token_id=pad,
                   repetition_penalty=settings.repetition_penalty)
    if sample:
        options.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)
    numbers = range(settings.num_samples if sample else 1)  # greedy: every sample would be the same
    out = []
    for prompt_index, prompt in enumerate(prompts):
        texts = []
        for number in numbers:
            set_seed(sample_seed(settings.seed, prompt_index, number))
            texts += continuations(model, tokenizer, prompt, **options)
        out.append(texts)
    return out


def generation_report(names: list[str], prompts: list[str], samples: list[list[list[str]]],
                      settings: SamplingSettings) -> str:
    """Markdown: the settings, then per prompt each model's samples side by side (one column per model)."""
    from sparknet.eval.reports import markdown_table

    lines = ["# Samples", "", "settings: " + ", ".join(f"{k}={v}" for k, v in vars(settings).items()), ""]
    for index, prompt in enumerate(prompts):
        lines += [f"## Prompt {index + 1}", "", "```", prompt, "```", ""]
        # a cell: the prompt in bold, then the continuation, on one table line (newlines as <br>; markdown_table
        # escapes `|`)
        cells = [[f"**{prompt}**{text}".replace("\n", "<br>") for text in per_model[index]] for per_model in samples]
        rows = [[number + 1] + [column[number] if number < len(column) else "" for column in cells]
                for number in range(max(len(column) for column in cells))]
        lines.append(markdown_table(["#", *names], rows))
    return "\n".join(lines)
