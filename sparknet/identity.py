"""Saved identities against today's: a run's or a dataset's recorded settings compared key by key
(`describe_changes`, for the errors that refuse to mix them), and the fingerprint of a mix's local data files, so
that an edited file counts as another input (`local_files_fingerprint`)."""

from __future__ import annotations

import json
from typing import Any

from sparknet.config import MixConfig, expand_pattern


def describe_changes(old: dict[str, Any], new: dict[str, Any], upper: bool = False, limit: int = 80) -> list[str]:
    """`key: old -> new` for every key whose value differs (values as compact JSON cut to `limit` characters), for
    the errors that refuse to mix a saved run or dataset with other settings; `upper` names keys as constants."""

    def short(value: Any) -> str:
        text = json.dumps(value, sort_keys=True)
        return text if len(text) <= limit else text[: limit - 3] + "..."

    keys = sorted(set(old) | set(new))
    return [f"{k.upper() if upper else k}: {short(old.get(k))} -> {short(new.get(k))}"
            for k in keys if old.get(k) != new.get(k)]


def local_files_fingerprint(config: MixConfig) -> dict[str, str]:
    """sha256 of every local data file of the mix, so that an edited file counts as another input (Hub sources
    are named by id, split and revision only)."""
    import hashlib

    out: dict[str, str] = {}
    for spec in config.mix:
        files = spec.resolved_data_files()
        groups = files.values() if isinstance(files, dict) else [files or []]
        for pattern in (f for group in groups for f in group):
            for path in expand_pattern(pattern):
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 22):
                        digest.update(chunk)
                out[path] = digest.hexdigest()
    return out
