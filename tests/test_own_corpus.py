"""MAX_STEPS, as a user runs it: exactly that many optimizer steps, the LR schedule over them, and refused
with TARGET_TOKENS in one line."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from tests.helpers import (
    read_steps,
    run_script,
    train_args,
)


def _without(args: list[str], *flags: str) -> list[str]:
    """`args` (flag value pairs) without the given flags: those constants keep the script's defaults."""
    out = []
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag.lstrip("-") not in flags:
            out += [flag, value]
    return out


@pytest.mark.slow
def test_max_steps_trains_exactly_that_many_steps_with_the_schedule_over_them(tiny_dataset: Path,
                                                                              tmp_path: Path) -> None:
    args = _without(train_args(tmp_path, tiny_dataset, max_steps=7, eval_steps=7, save_steps=7, sample_steps=0,
                               record_batches=True, warmup_ratio=0.0), "target_tokens")
    proc = run_script("train_sparknet_v5.py", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "ckpt" / "run"
    meta = json.loads((run_dir / "training_metadata.json").read_text())
    assert meta["steps"] == 7 and meta["tokens_seen"] == 7 * 4 * 128
    assert json.loads((run_dir / "checkpoint-7" / "trainer_state.json").read_text())["global_step"] == 7
    steps = read_steps(run_dir / "batches.jsonl")
    assert sorted(steps) == list(range(1, 8))
    # cosine from the peak (3e-3) down to MIN_LR_RATIO (0.1) of it over the 7 steps: the LR of step s is the
    # schedule's at s - 1
    lrs = [steps[s]["lr"] for s in range(1, 8)]
    assert lrs[0] == pytest.approx(3e-3)
    assert lrs[-1] == pytest.approx(3e-4 + 0.5 * 2.7e-3 * (1 + math.cos(math.pi * 6 / 7)), rel=1e-4)
    assert re.search(r"budget: [\d,]+ tokens = 7 steps", proc.stderr), proc.stderr[-3000:]


@pytest.mark.parametrize("script", ["train_sparknet_v5.py", "train_sparknet.py"])
def test_max_steps_with_target_tokens_is_refused_in_one_line(script: str) -> None:
    proc = run_script(script, "--max_steps", 10, "--target_tokens", 100_000)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "MAX_STEPS=10" in proc.stderr and "TARGET_TOKENS" in proc.stderr, (
        proc.stderr)
