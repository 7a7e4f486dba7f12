"""BENCHMARK_EVERY: benchmarks during training, every N evaluations, logged to TensorBoard beside the loss.

The tasks are lm-eval's (BENCHMARK_TASKS), scored on the model in memory through the same code as
scripts/eval_benchmarks.py (`sparknet.harness.run_benchmarks`). The offline suite (`sparknet_continuation`)
is written once per run from the run's own validation blocks (decoded, cut at each EOS into documents), so it needs
no file and no network and never holds a training document. Off by default: it costs evaluation time, which the
throughput figures leave out as they leave out evaluation.

It changes nothing about training: it runs on the main process only, in eval mode, and puts back the model's train
mode and every RNG lm-eval seeds (Python's, NumPy's, torch's), so a run with it trains the same weights as one
without; the steps it runs at follow from the step count, so a resumed run benchmarks at the same steps.
"""

from __future__ import annotations

import logging
import random
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from sparknet.harness import METRICS

log = logging.getLogger("sparknet.train")
SUITE_FOLDER = "benchmark_suite"  # in the run folder: the offline suite's items and task YAML


def suite_documents(tokenizer: Any, val_tokens: np.ndarray) -> list[str]:
    """The validation blocks as text, cut at each EOS: the documents (and pieces of documents at the blocks'
    edges) the offline suite's items are taken from."""
    eos = tokenizer.eos_token_id
    documents: list[str] = []
    for block in val_tokens:
        ids = [int(token) for token in block]
        starts = [0] + [i + 1 for i, token in enumerate(ids) if token == eos]
        ends = [i for i, token in enumerate(ids) if token == eos] + [len(ids)]
        documents += [tokenizer.decode(ids[a:b]) for a, b in zip(starts, ends, strict=True) if b > a]
    return documents


@contextmanager
def rng_kept() -> Any:
    """Python's, NumPy's and torch's RNG states (CUDA's too) as they were before the block."""
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
              torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if states[3] is not None:
            torch.cuda.set_rng_state_all(states[3])


def _no_chat_template_advice(record: logging.LogRecord) -> bool:
    """lm-eval reads "chat" in a model's repr (NanoChat) as a chat model and prints the whole repr to say so."""
    return "appears to be an" not in record.getMessage()


class PeriodicBenchmark(TrainerCallback):
    """At every `every`-th evaluation (step 0's included), `tasks` on the model, `limit` items each (0: all),
    written to TensorBoard as `benchmark/<task>/<metric>` and logged; `last` holds the latest scores."""

    def __init__(self, *, every: int, tasks: list[str], limit: int, writer: Any, tokenizer: Any,
                 suite_texts: list[str], run_dir: Path) -> None:
        self.every, self.tasks, self.limit = every, tasks, limit
        self.writer, self.tokenizer = writer, tokenizer
        self.suite_texts, self.run_dir = suite_texts, run_dir
        self.last: dict[str, dict[str, float]] = {}
        self.last_step = -1
        self._suite: Path | None = None

    def due(self, step: int, eval_steps: int) -> bool:
        """Whether the evaluation at `step` is one that benchmarks: every `every`-th, counted from step 0."""
        return step % (eval_steps * self.every) == 0 and step != self.last_step

    def on_evaluate(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        if model is None or not state.is_world_process_zero or not self.due(state.global_step, args.eval_steps):
            return
        self.last_step = state.global_step
        scores = self.run(model)
        for task, figures in scores.items():
            for metric in METRICS:
                if metric in figures:
                    self.writer.add_scalar(f"benchmark/{task}/{metric}", figures[metric], state.global_step)
        self.writer.flush()
        log.info("bench  step %6d  %s", state.global_step, "  ".join(
            f"{task} acc {figures.get('acc', float('nan')):.3f}" for task, figures in scores.items()))

    def run(self, model: Any) -> dict[str, dict[str, float]]:
        """The tasks' scores on `model` now, its train mode and the RNGs as they were."""
        from sparknet.harness import SUITE_TASK, run_benchmarks, write_offline_suite

        model = getattr(model, "module", model)  # DDP
        model = getattr(model, "_orig_mod", model)  # torch.compile
        if SUITE_TASK in self.tasks and self._suite is None:
            self._suite = write_offline_suite(self.suite_texts, self.run_dir / SUITE_FOLDER, items=self.limit or 100)
        logging.getLogger("lm_eval.evaluator").addFilter(_no_chat_template_advice)
        was_training = model.training
        try:
            with rng_kept():
                # the run's tokenizer as `load_tokenizer` loaded it: a literal "<|endoftext|>" in a task's text is
                # text, as in training (sparknet.tokenizer's rule)
                self.last = run_benchmarks(model, self.tokenizer, self.tasks, self._suite,
                                           limit=self.limit or None, device=str(next(model.parameters()).device))
        finally:
            model.train(was_training)
        return self.last
