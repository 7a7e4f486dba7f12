"""Results kept per evaluation setting, and which of them stands for the model.

An evaluation's result is stored under its setting (perplexity: the data, its split, the documents scored and the
window; a benchmark: the task, its items and shots), so a smaller evaluation of the same data (`MAX_DOCUMENTS`,
`LIMIT`) is kept beside a fuller one and never replaces it. Where one figure must stand for the model (the card, its
model-index), it is the fullest of them: the most tokens (then documents) scored, the most items; of equally full
ones, the last written (results files keep their entries in the order they were written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparknet.common.errors import UserError

# What every result records of what it was computed on, and what no results file from before settings were kept
# holds: such a file is refused in one line, never read (older SparkNet versions read it; nothing migrates it).
PERPLEXITY_KEYS = ("data", "documents", "tokens")
BENCHMARK_KEYS = ("task", "items", "shots")


def perplexity_setting(row: dict[str, Any]) -> str:
    """The key of a perplexity result in perplexity.json: what was scored and how."""
    split = f" ({row['split']})" if row.get("split") else ""
    return f"{row['data']}{split}, {row['documents']} documents, context {row['context']}, stride {row['stride']}"


def fullest_perplexities(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per data (and split): the fullest."""
    fullest: dict[tuple[str, str | None], dict[str, Any]] = {}
    for row in results.values():
        data = (row["data"], row.get("split"))
        if data not in fullest or _extent(row) >= _extent(fullest[data]):
            fullest[data] = row
    return list(fullest.values())


def _extent(row: dict[str, Any]) -> tuple[int, int]:
    return row["tokens"], row["documents"]


def benchmark_setting(task: str, scores: dict[str, Any]) -> str:
    """The key of a task's result in benchmarks.json's `settings`: the task, the items scored, the shots."""
    return f"{task}, {scores['items']} items, {scores['shots']}-shot"


def fullest_benchmarks(settings: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{task: scores} of the fullest result of each task: the most items."""
    fullest: dict[str, dict[str, Any]] = {}
    for entry in settings.values():
        scores = {key: value for key, value in entry.items() if key != "task"}
        if entry["task"] not in fullest or scores["items"] >= fullest[entry["task"]]["items"]:
            fullest[entry["task"]] = scores
    return fullest


def check_perplexities(path: Path, results: dict[str, Any]) -> None:
    """One line when perplexity.json at `path` holds a result that does not say what it was computed on."""
    for key, row in results.items():
        _check_recorded(path, key, row, PERPLEXITY_KEYS)


def check_benchmarks(path: Path, data: dict[str, Any]) -> None:
    """One line when benchmarks.json at `path` keeps its results without their settings (items and shots)."""
    if data and not isinstance(data.get("settings"), dict):
        raise UserError(f"{path} keeps results without the settings they were computed with (written by an older "
                        "SparkNet): it is not read; move it away and evaluate again")
    for key, entry in (data.get("settings") or {}).items():
        _check_recorded(path, key, entry, BENCHMARK_KEYS)


def _check_recorded(path: Path, key: str, result: Any, keys: tuple[str, ...]) -> None:
    missing = [name for name in keys if not isinstance(result, dict) or name not in result]
    if missing:
        raise UserError(f"{path}: the result {key!r} does not record its {', '.join(missing)} (written by an older "
                        "SparkNet): the file is not read; move it away and evaluate again")
