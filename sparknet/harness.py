"""Benchmarks through lm-eval-harness (`simple_evaluate` with its `hf` model), and the project's offline suite: a
multiple-choice continuation task over local held-out documents, defined as an lm-eval task YAML, so CI and the demo
run the same code path as hellaswag or arc_easy without the network.

Scoring a model here is shared by evaluation (scripts/eval_benchmarks.py, with sparknet.eval.benchmarks keeping its
results) and the trainer's periodic benchmark (BENCHMARK_EVERY), which sits below evaluation.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import traceback
from pathlib import Path
from typing import Any

from sparknet.common.errors import UserError

SUITE_TASK = "sparknet_continuation"
METRICS = ("acc", "acc_norm")


def write_offline_suite(texts: list[str], out_dir: Path, items: int = 100, seed: int = 0, context_words: int = 24,
                        choice_words: int = 8, choices: int = 4) -> Path:
    """Writes <out_dir>/sparknet_continuation.{jsonl,yaml}: each item is a passage of `context_words` words from a
    held-out document, its true next `choice_words` words, and spans of the same length from other documents as
    distractors (a model that has learned the text picks the true continuation). Returns the folder (lm-eval's
    include_path). The same texts and seed give the same items."""
    rng = random.Random(seed)
    words = [text.split() for text in texts]
    usable = [i for i, w in enumerate(words) if len(w) >= context_words + choice_words]
    if len(usable) < choices:
        raise UserError(f"the offline suite needs at least {choices} documents of {context_words + choice_words}+ "
                        f"words, found {len(usable)}")
    records = []
    for _ in range(items):
        doc = rng.choice(usable)
        start = rng.randrange(len(words[doc]) - context_words - choice_words + 1)
        context = " ".join(words[doc][start:start + context_words])
        true = " ".join(words[doc][start + context_words:start + context_words + choice_words])
        options = [true]
        for other in rng.sample([i for i in usable if i != doc], choices - 1):
            at = rng.randrange(len(words[other]) - choice_words + 1)
            options.append(" ".join(words[other][at:at + choice_words]))
        rng.shuffle(options)
        records.append({"context": context, "choices": options, "label": options.index(true)})
    out_dir.mkdir(parents=True, exist_ok=True)
    data = out_dir / f"{SUITE_TASK}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    (out_dir / f"{SUITE_TASK}.yaml").write_text(
        f"task: {SUITE_TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{context}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{label}}\"\nmetric_list:\n"
        + "".join(f"  - metric: {m}\n    aggregation: mean\n    higher_is_better: true\n" for m in METRICS)
        + "metadata:\n  version: 1.0\n")
    return out_dir


def run_benchmarks(model_source: Any, tokenizer_source: Any, tasks: list[str], include_path: Path | None = None, *,
                   limit: int | None = None, batch_size: int = 8, num_fewshot: int | None = None,
                   device: str | None = None) -> dict[str, dict[str, float]]:
    """{task: {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "items", "shots"}} of one model (items: those
    scored, after `limit`): a folder or Hub id with its tokenizer in memory (eval_benchmarks.py loads it with
    `load_tokenizer`, so special-token text in a task is text, as in training; harness sits below the tokenizer
    floor), or a model and tokenizer in memory (the trainer's periodic benchmark). Unknown task names and Hub tasks
    offline are UserErrors."""
    import datasets
    import lm_eval.api.model
    import lm_eval.api.task
    import lm_eval.models.huggingface
    import torch
    from lm_eval import simple_evaluate

    from sparknet.common.progress import route_library_bars
    from sparknet.common.runtime import hide_library_progress_bars, use_compute_threads

    hide_library_progress_bars()
    datasets.disable_progress_bars()  # "Generating test split" of each task's data
    # lm-eval's bars (building contexts, tokenizing, the requests) as ours: whole lines in a log file
    route_library_bars(lm_eval.api.task, lm_eval.api.model, lm_eval.models.huggingface)
    logging.getLogger("transformers.modeling_utils").addFilter(_no_attention_mask_advice)

    # Indexing lm-eval's own task catalogue takes ~10 s: the offline suite alone skips it.
    only_suite = include_path is not None and set(tasks) == {SUITE_TASK}
    manager = _task_manager(str(include_path) if include_path else None, not only_suite)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        raise UserError(f"unknown task(s) {', '.join(unknown)}: see `lm-eval ls tasks`, or {SUITE_TASK} (offline)")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    if isinstance(model_source, str):  # a script's evaluation (a trainer's periodic one keeps the trainer's threads)
        threads = use_compute_threads("cpu" if device == "cpu" else "accelerator")  # lm-eval leaves torch's default
        if threads:
            logging.getLogger("sparknet.eval").info("%s on %s, %s", model_source, device, threads)
    try:
        output = simple_evaluate(model="hf", model_args={"pretrained": model_source, "tokenizer": tokenizer_source,
                                                         "dtype": dtype}, tasks=tasks, task_manager=manager,
                                 limit=limit, batch_size=batch_size, num_fewshot=num_fewshot, device=device,
                                 log_samples=False, bootstrap_iters=1000)
    except AssertionError as exc:
        # lm-eval scores each choice whole and asserts that it fits the model's context: a model's limit, not a bug
        if traceback.extract_tb(exc.__traceback__)[-1].name != "_loglikelihood_tokens":
            raise
        raise UserError(f"{model_source}: an answer choice of task(s) {', '.join(tasks)} is longer than the model's "
                        f"context of {_context_of(model_source)} tokens (lm-eval scores each choice whole): evaluate a "
                        "model with a longer context, or tasks with shorter choices") from None
    except Exception:  # a Hub task without the network fails deep inside datasets
        offline = os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"
        hub_tasks = [t for t in tasks if t != SUITE_TASK]
        if offline and hub_tasks:
            raise UserError(f"{', '.join(hub_tasks)}: {'these tasks need' if len(hub_tasks) > 1 else 'this task needs'}"
                            f" data from the Hub and the network is off (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE): run "
                            f"online once, or use {SUITE_TASK}") from None
        raise
    results = {}
    for task in tasks:
        raw = output["results"][task]
        results[task] = {key: float(raw[f"{key},none"]) for m in METRICS for key in (m, f"{m}_stderr")
                         if isinstance(raw.get(f"{key},none"), (int, float))}
        results[task].update(computed_on(output, task))
    return results


def computed_on(output: dict[str, Any], task: str) -> dict[str, Any]:
    """What `task`'s scores in lm-eval's `output` were computed on: the items scored (after LIMIT; a group's, such
    as mmlu's, are its subtasks' together) and the few-shot examples per item ("mixed" for a group whose subtasks
    take different numbers)."""
    def items(name: str) -> int:
        if name in output["n-samples"]:
            return int(output["n-samples"][name]["effective"])
        return sum(items(sub) for sub in output["group_subtasks"][name])

    return {"items": items(task), "shots": output["n-shot"].get(task, "mixed")}


def _context_of(model_source: str) -> int | str:
    """The model's context in tokens, as its config gives it ("?" when it names none)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_source)
    return next((getattr(config, key) for key in ("n_positions", "max_position_embeddings")
                 if isinstance(getattr(config, key, None), int)), "?")


def _no_attention_mask_advice(record: logging.LogRecord) -> bool:
    """lm-eval scores right-padded batches without an attention mask, which is exact for a causal LM: transformers'
    advice to pass one would interleave with the results. (A function, so that adding it again adds nothing.)"""
    return "attention_mask" not in record.getMessage()


@functools.lru_cache(maxsize=4)
def _task_manager(include_path: str | None, include_defaults: bool) -> Any:
    """lm-eval's task index, built once per process (one per model would repeat the ~10 s indexing)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path, include_defaults=include_defaults)
