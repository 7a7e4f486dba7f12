"""Saved identities against today's: a run's or a dataset's recorded settings compared key by key
(`describe_changes`, for the errors that refuse to mix them), and the fingerprint of a mix's local data files, so
that an edited file counts as another input (`local_files_fingerprint`)."""

from __future__ import annotations

import json
from typing import Any

from sparknet.common.runtime import file_sha256
from sparknet.config.mix import MixConfig, expand_pattern


def describe_changes(old: dict[str, Any], new: dict[str, Any], upper: bool = False, limit: int = 80) -> list[str]:
    """`path: old -> new` for every leaf that differs, for the errors that refuse to mix a saved run or dataset with
    other settings. Dicts (and lists of one length) are descended into, so that a change deep in a dataset's inputs
    is named by its key path (`dataset_inputs.local_files_sha256.data/a.jsonl`), not shown as two identical
    prefixes of the whole; values are compact JSON cut to `limit` characters around where they first differ.
    `upper` names the top-level keys as constants. An absent key reads as null."""
    changes: list[str] = []

    def walk(path: str, before: Any, after: Any) -> None:
        if before == after:
            return
        if isinstance(before, dict) and isinstance(after, dict):
            for key in sorted(set(before) | set(after), key=str):
                walk(f"{path}.{key}", before.get(key), after.get(key))
        elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
            for index, (a, b) in enumerate(zip(before, after, strict=True)):
                walk(f"{path}[{index}]", a, b)
        else:
            a, b = json.dumps(before, sort_keys=True), json.dumps(after, sort_keys=True)
            changes.append(f"{path}: {_around_difference(a, b, limit)} -> {_around_difference(b, a, limit)}")

    for key in sorted(set(old) | set(new)):
        walk(key.upper() if upper else key, old.get(key), new.get(key))
    return changes


def _around_difference(text: str, other: str, limit: int) -> str:
    """`text` cut to `limit` characters so that where it first differs from `other` is shown (with a little before
    it for context); "…" marks what was cut."""
    if len(text) <= limit:
        return text
    first = next((i for i, (a, b) in enumerate(zip(text, other, strict=False)) if a != b),
                 min(len(text), len(other)))
    start = max(0, min(first - 8, len(text) - limit))
    shown = text[start:start + limit]
    if start > 0:
        shown = "…" + shown[1:]
    if start + limit < len(text):
        shown = shown[:-1] + "…"
    return shown


def local_files_fingerprint(config: MixConfig) -> dict[str, str]:
    """sha256 of every local data file of the mix, so that an edited file counts as another input (Hub sources
    are named by id, split and revision only)."""
    out: dict[str, str] = {}
    for spec in config.mix:
        for pattern in spec.data_file_patterns():
            for path in expand_pattern(pattern):
                out[path] = file_sha256(path)
    return out
