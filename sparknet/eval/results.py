"""Results kept per evaluation setting, and which of them stands for the model.

An evaluation's result is stored under its setting (perplexity: the data, its split, the documents scored and the
window; a benchmark: the task, its items and shots), so a smaller evaluation of the same data (`MAX_DOCUMENTS`,
`LIMIT`) is kept beside a fuller one and never replaces it. Where one figure must stand for the model (the card, its
model-index), it is the fullest of them: the most tokens (then documents) scored, the most items; of equally full
ones, the last written (results files keep their entries in the order they were written).
"""

from __future__ import annotations

from typing import Any


def perplexity_setting(row: dict[str, Any]) -> str:
    """The key of a perplexity result in perplexity.json: what was scored and how."""
    split = f" ({row['split']})" if row.get("split") else ""
    return f"{row['data']}{split}, {row['documents']} documents, context {row['context']}, stride {row['stride']}"


def fullest_perplexities(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per data (and split): the fullest. Older files (keyed by data, without `documents`) read too."""
    fullest: dict[tuple[str, str | None], dict[str, Any]] = {}
    for key, row in results.items():
        if not isinstance(row, dict):
            continue
        data = (str(row.get("data", key)), row.get("split"))
        if data not in fullest or _extent(row) >= _extent(fullest[data]):
            fullest[data] = row
    return list(fullest.values())


def _extent(row: dict[str, Any]) -> tuple[int, int]:
    return int(row.get("tokens") or 0), int(row.get("documents") or 0)


def benchmark_setting(task: str, scores: dict[str, Any]) -> str:
    """The key of a task's result in benchmarks.json's `settings`: the task, the items scored, the shots."""
    items = scores.get("items")
    shots = scores.get("shots")
    return (f"{task}, {items if items is not None else 'unrecorded'} items, "
            f"{shots if shots is not None else 'default'}-shot")


def fullest_benchmarks(settings: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{task: scores} of the fullest result of each task (the most items; a result whose items were not recorded,
    from an older file, counts as fewer than any recorded one)."""
    fullest: dict[str, dict[str, Any]] = {}
    for entry in settings.values():
        task = entry.get("task")
        if not isinstance(task, str):
            continue
        scores = {key: value for key, value in entry.items() if key != "task"}
        if task not in fullest or _items(scores) >= _items(fullest[task]):
            fullest[task] = scores
    return fullest


def _items(scores: dict[str, Any]) -> int:
    items = scores.get("items")
    return items if isinstance(items, int) else -1
