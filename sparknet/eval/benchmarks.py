"""Benchmark results: each task's scores kept per setting in a results file, and the table of several models'
(the scores themselves come from sparknet.harness: lm-eval-harness and the offline suite).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sparknet.harness import METRICS


def save_results(path: Path, scores: dict[str, dict[str, Any]]) -> None:
    """Adds the tasks' scores to <path>: `settings` holds every result, one per task and setting (items, shots), so
    a run with a LIMIT is kept beside a fuller one and never replaces it; `results` ({task: scores}, what the card's
    model-index reads) is the fullest of each task (sparknet.eval.results)."""
    from sparknet.eval.reports import update_json
    from sparknet.eval.results import benchmark_setting, fullest_benchmarks

    def add(data: dict[str, Any]) -> None:
        settings = data.get("settings", {})  # a file from before settings were kept: refused by check_benchmarks
        for task, new in scores.items():
            key = benchmark_setting(task, new)
            settings.pop(key, None)  # the same setting again: the new result, written last
            settings[key] = {"task": task, **new}
        data["results"] = fullest_benchmarks(settings)
        data["settings"] = settings
        for task, new in scores.items():
            standing = data["results"][task]
            if standing != new:
                logging.getLogger("sparknet.eval").info(
                    "%s: this result (%s items) is kept beside a fuller one (%s items) in %s: the card shows the "
                    "fuller result", task, new["items"], standing["items"], path)

    update_json(path, add)


def benchmark_table(names: list[str], results: list[dict[str, dict[str, float]]]) -> tuple[list[str], list[list]]:
    """One row per task and metric, one column per model: "0.4100 ± 0.0100"."""
    rows = []
    for task in results[0]:
        for metric in METRICS:
            cells = []
            for per_model in results:
                values = per_model.get(task, {})
                cells.append(f"{values[metric]:.4f} ± {values.get(f'{metric}_stderr', float('nan')):.4f}"
                             if metric in values else "-")
            rows.append([task, metric, *cells])
    return ["task", "metric", *names], rows
