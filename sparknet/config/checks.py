"""The allowed values of the scripts' constants, in one table keyed by the constant's name, checked before a script
does any work (before the slow imports of torch and transformers, and before any data is opened).

A name means the same in every script that has it (`BATCH_SIZE` is always a count of blocks or windows, `SEED`
always a 32-bit seed), so one rule serves all of them. `run_script` checks every constant a script has against its
rule; code that builds settings without a script (the trainers' `TrainSettings`, `SamplingSettings`) calls
`check_values` on the same table. Rules between constants (SAVE_STEPS a multiple of EVAL_STEPS) are in `RELATIONS`.
Every problem is reported at once, in one line.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparknet.common.errors import UserError
from sparknet.config.licenses import HUB_LICENSES, LICENSES_PAGE  # plain data
from sparknet.model.optimizers import OPTIMIZERS  # names and builders; imports no torch
from sparknet.model.presets import PRESETS  # plain data: no heavy imports

MAX_SEED = 2**32 - 1  # numpy's and the shuffles' seeds are 32-bit
# the shortest block (BLOCK_SIZE, a config's context_length): checked by the build, the stream and the config
MIN_BLOCK, MIN_BLOCK_WHY = 2, "a block of one token has no next token to predict"


@dataclass(frozen=True)
class Rule:
    """`test` says whether a value is allowed; `expected` completes "NAME=value: expected ..."."""

    test: Callable[[Any], bool]
    expected: str
    none: bool = False  # None is allowed too (derived at run time)
    choices: tuple[str, ...] = ()  # the allowed words, for a did-you-mean hint
    always_near: bool = False  # name the nearest choice however far (a licence id: any is a better start than none)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer(low: int = 1, high: int | None = None, expected: str = "", none: bool = False) -> Rule:
    """A whole number in [low, high]."""
    text = expected or ("a positive integer" if low == 1 and high is None else
                        f"an integer >= {low}" if high is None else f"an integer from {low} to {high}")
    return Rule(lambda v: _is_int(v) and v >= low and (high is None or v <= high), text, none)


def number(low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False,
           expected: str = "", none: bool = False) -> Rule:
    """A finite number in the interval; open ends excluded."""
    left, right = "(" if low_open else "[", ")" if high_open or high == math.inf else "]"
    text = expected or (f"a number > {low:g}" if low_open and high == math.inf else
                        f"a number >= {low:g}" if high == math.inf else f"a number in {left}{low:g}, {high:g}{right}")

    def test(v: Any) -> bool:
        return _is_number(v) and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)

    return Rule(test, text, none)


def choice(*values: str) -> Rule:
    return Rule(lambda v: v in values, " or ".join(", ".join(values).rsplit(", ", 1)), choices=values)


def _plain_name(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and "/" not in value and not value.startswith(".")


POSITIVE = integer(1)
COUNT = integer(0, expected="an integer >= 0")
FRACTION = number(0, 1, high_open=True, expected="a fraction in [0, 1)")
SEED = integer(0, MAX_SEED)
LR = number(0, low_open=True, expected="a positive number")

RULES: dict[str, Rule] = {
    # training (both trainers)
    "RUN_NAME": Rule(_plain_name, "a plain folder name such as sparknet-70m-v5"),
    "MODEL_PRESET": Rule(choice(*PRESETS).test, choice(*PRESETS).expected, none=True, choices=tuple(PRESETS)),
    "TARGET_TOKENS": integer(1, expected="a positive number of tokens", none=True),
    "MAX_STEPS": integer(0, expected="an integer >= 0 (0: not set, TARGET_TOKENS decides)"),
    "BATCH_SIZE": POSITIVE,
    "GLOBAL_BATCH_SIZE": POSITIVE,
    "LEARNING_RATE": LR,
    "OPTIMIZER": choice(*OPTIMIZERS),  # the registry (sparknet.model.optimizers)
    "MUON_LEARNING_RATE": LR,
    "EMBEDDING_LEARNING_RATE": Rule(LR.test, LR.expected, none=True),
    "LR_SCHEDULE": choice("cosine", "wsd"),
    "DECAY_RATIO": number(0, 1, low_open=True, expected="a fraction in (0, 1]"),
    "MIN_LR_RATIO": number(0, 1, expected="a fraction in [0, 1]"),
    "WARMUP_RATIO": FRACTION,
    "WEIGHT_DECAY": number(0),
    "ADAM_BETAS": Rule(lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(
        _is_number(b) and 0 <= b < 1 for b in v), "two numbers in [0, 1)"),
    "MAX_GRAD_NORM": number(0, expected="a number >= 0 (0: no clipping)"),
    "DROPOUT": FRACTION,
    "EVAL_STEPS": POSITIVE,
    "SAVE_STEPS": POSITIVE,
    "SAVE_TOTAL_LIMIT": POSITIVE,
    "SAMPLE_STEPS": integer(0, expected="an integer >= 0 (0: only at the end)"),
    "SAMPLE_MAX_NEW_TOKENS": POSITIVE,
    "SAMPLE_TEMPERATURE": number(0, expected="a number >= 0 (0: greedy)"),
    "SAMPLE_TOP_K": integer(0, expected="an integer >= 0 (0: no limit)"),
    "SAMPLE_SEED": SEED,
    "BENCHMARK_EVERY": integer(0, expected="an integer >= 0 (0: never)"),
    "BENCHMARK_TASKS": Rule(lambda v: isinstance(v, list) and bool(v) and all(isinstance(t, str) and t for t in v),
                            "a non-empty list of lm-eval task names"),
    "BENCHMARK_LIMIT": integer(0, expected="an integer >= 0 (0: every item)"),
    "LOGGING_STEPS": POSITIVE,
    "COMPILE": choice("auto", "on", "off"),
    "SEED": Rule(SEED.test, SEED.expected, none=True),
    "PEAK_TFLOPS": number(0, expected="a number >= 0 (0: from the table of GPUs)"),
    "NONFINITE": choice("stop", "skip"),
    # data
    "BLOCK_SIZE": integer(MIN_BLOCK, expected=f"{MIN_BLOCK} or more tokens ({MIN_BLOCK_WHY})", none=True),
    "VAL_TOKENS": integer(1, expected="a positive number (the trainer evaluates on them)", none=True),
    "SHUFFLE_BUFFER": integer(0, expected="0 (each source's order) or a number of documents", none=True),
    "SHUFFLE_WINDOW": integer(0, expected="0 (the stream's order) or a number of blocks"),
    "ON_EXHAUSTED": choice("renormalise", "stop", "restart", "fail"),
    "NUM_WORKERS": integer(0, expected="an integer >= 0 (0: encode in this process)", none=True),
    "DATA_SEED": Rule(SEED.test, SEED.expected, none=True),
    "DTYPE": choice("auto", "uint16", "uint32"),
    "READ_AHEAD": integer(0, expected="an integer >= 0 (0: no read-ahead thread)", none=True),
    "CHECKPOINT_SECONDS": number(0, expected="a number of seconds >= 0 (0: never)"),
    "HUB_RETRY_MINUTES": number(0, expected="a number of minutes >= 0 (0: no retry past the libraries' own)"),
    # tokenizer and demo corpus
    "VOCAB_SIZE": integer(257, expected="257 or more (a byte-level BPE needs 256 bytes + <|endoftext|>)"),
    "MAX_BYTES": integer(1, expected="a positive number of bytes"),
    "MIN_FREQUENCY": POSITIVE,
    "HELDOUT_DOCS": COUNT,
    "MAX_CODE_MB": number(0, low_open=True),
    "MAX_FILE_KB": POSITIVE,
    "VAL_PERCENT": number(0, 100, low_open=True, high_open=True, expected="a percentage in (0, 100)"),
    # the demo
    "TOKENIZER_BYTES": POSITIVE,
    "TRAIN_TOKENS": POSITIVE,
    "BENCHMARK_ITEMS": POSITIVE,
    # evaluation
    "LIMIT": integer(0, expected="an integer >= 0 (0: every item)"),
    "NUM_FEWSHOT": integer(0, expected="an integer >= 0", none=True),
    "SUITE_ITEMS": POSITIVE,
    "HOLDOUT_ROWS": integer(0, expected="an integer >= 0 (0: the rows a streaming run held out)"),
    "CONTEXT": integer(1, none=True),
    "STRIDE": integer(1, none=True),
    "MAX_DOCUMENTS": integer(0, expected="an integer >= 0 (0: all)"),
    "TEMPERATURE": number(0, expected=">= 0 (0: greedy)"),
    "TOP_P": number(0, 1, low_open=True, expected="in (0, 1]"),
    "TOP_K": integer(0, expected=">= 0 (0: no limit)"),
    "REPETITION_PENALTY": number(0, low_open=True, expected="> 0 (1: none)"),
    "MAX_NEW_TOKENS": integer(1, expected=">= 1"),
    "NUM_SAMPLES": integer(1, expected=">= 1"),
    # export
    "LICENSE": Rule(lambda v: v == "" or v in HUB_LICENSES, f"a Hub licence id ({LICENSES_PAGE}), or \"\" for "
                    "none stated", choices=HUB_LICENSES, always_near=True),
}


def _multiple(values: dict[str, Any]) -> str | None:
    save, every = values["SAVE_STEPS"], values["EVAL_STEPS"]
    if _is_int(save) and _is_int(every) and every > 0 and save % every:
        return (f"SAVE_STEPS={save} must be a multiple of EVAL_STEPS={every} (the best checkpoint is chosen on eval "
                "loss)")
    return None


def _stride_within_context(values: dict[str, Any]) -> str | None:
    context, stride = values["CONTEXT"], values["STRIDE"]
    if _is_int(context) and _is_int(stride) and stride > context:
        return f"STRIDE={stride} must be at most CONTEXT={context}"
    return None


def _one_budget(values: dict[str, Any]) -> str | None:
    steps, tokens = values["MAX_STEPS"], values["TARGET_TOKENS"]
    if _is_int(steps) and steps > 0 and tokens is not None:
        return (f"MAX_STEPS={steps} and TARGET_TOKENS={tokens} both give the budget: set one of them "
                "(TARGET_TOKENS=None, or MAX_STEPS=0)")
    return None


# (the names a relation reads, the check: a message or None)
RELATIONS: list[tuple[tuple[str, ...], Callable[[dict[str, Any]], str | None]]] = [
    (("SAVE_STEPS", "EVAL_STEPS"), _multiple),
    (("CONTEXT", "STRIDE"), _stride_within_context),
    (("MAX_STEPS", "TARGET_TOKENS"), _one_budget),
]


def problems(values: dict[str, Any]) -> list[str]:
    """What is wrong with `values` ({CONSTANT: value}); names without a rule are not checked."""
    found = []
    for name, value in values.items():
        rule = RULES.get(name)
        if rule is None or (value is None and rule.none):
            continue
        if not rule.test(value):
            shown = value if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
            if isinstance(value, (list, tuple)):
                shown = list(value)
            near = difflib.get_close_matches(value.lower(), rule.choices, n=1, cutoff=0 if rule.always_near else 0.6
                                             ) if isinstance(value, str) else []
            found.append(f"{name}={shown}: expected {rule.expected}" + (f" (did you mean {near[0]}?)" if near else ""))
    for names, relation in RELATIONS:
        if all(n in values for n in names) and not any(n in {p.split("=")[0] for p in found} for n in names):
            message = relation(values)
            if message:
                found.append(message)
    return found


def check_values(values: dict[str, Any]) -> None:
    """Raises one UserError listing every problem of `values` ({CONSTANT: value})."""
    found = problems(values)
    if found:
        raise UserError("; ".join(found))
