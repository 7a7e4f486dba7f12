"""Whether the documents an evaluation scores come from sources a model was trained on: a model scored on another
run's held-out data (one table for a base and its anneal, say) may have trained on some of it, and the table should
say so only where that can be, with how many documents.

A source is named by what pins its documents: a local file by its sha256 (as the dataset inputs and run identities
record it, so a copy under another name is the same source), a Hub dataset by its id, subset and split. A model's
training sources come from its run's records (training_metadata.json, run_config.json); the scored data's from its
own (a packed dataset's manifest, a streaming run's run_config.json) or from its files, hashed now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparknet.common.runtime import file_sha256, project_path, read_json_object
from sparknet.config.mix import SourceSpec, expand_pattern, load_config
from sparknet.run_files import RUN_CONFIG, read_metadata, run_of


@dataclass
class Sources:
    """What pins a set of sources' documents: local files' sha256s (with a name for each) and Hub datasets."""

    files: dict[str, str] = field(default_factory=dict)  # sha256: the file's name
    hub: set[tuple[str, str | None, str]] = field(default_factory=set)  # (id, subset, split)

    def shared(self, other: Sources) -> list[str]:
        """The names (these sources' own) of what both hold."""
        return sorted({name for sha, name in self.files.items() if sha in other.files} |
                      {"/".join(part for part in hub[:2] if part) for hub in self.hub & other.hub})


def _of_mix(mix: list[dict[str, Any]], hashes: dict[str, str] | None = None) -> dict[str, Sources]:
    """Each mix entry's sources by label, its files' sha256s from `hashes` ({path: sha256}, as recorded) or read
    now."""
    out = {}
    for entry in mix:
        keys = ("name", "prob", "split", "data_files", "subset", "text_field", "label")
        spec = SourceSpec(**{key: entry[key] for key in keys if key in entry})
        sources = Sources()
        if spec.local is None:
            sources.hub.add((spec.name, spec.subset, spec.split))
        else:
            for pattern in spec.data_file_patterns():
                for path in expand_pattern(pattern):
                    sha = (hashes or {}).get(path) or (file_sha256(path) if Path(path).is_file() else None)
                    if sha is not None:
                        sources.files[sha] = Path(path).name
        out[spec.label] = sources
    return out


def trained_sources(folder: Path | None) -> Sources | None:
    """The sources a SparkNet run was trained on, from its records; None for a model that records none (a Hub
    model, an export)."""
    metadata = read_metadata(folder) if folder is not None else None
    if not metadata or not metadata.get("config", {}).get("mix"):
        return None
    hashes = (metadata.get("dataset", {}).get("inputs") or {}).get("local_files_sha256")
    identity = run_of(folder) / RUN_CONFIG
    if hashes is None and identity.is_file():  # a streaming run records them in its identity
        hashes = read_json_object(identity, "rerun the run's training command").get("local_files_sha256")
    return _merged(_of_mix(metadata["config"]["mix"], hashes))[None]


def scored_sources(data: str, kind: str) -> dict[str | None, Sources]:
    """The sources of the data an evaluation scores, by the label its documents carry (None: one set for all)."""
    path = project_path(data)
    if kind == "packed":
        inputs = read_json_object(path / "manifest.json", "rebuild the dataset").get("inputs") or {}
        return dict(_of_mix(inputs.get("mix") or [], inputs.get("local_files_sha256")))
    if kind == "blocks":
        identity = read_json_object(path.parent / "run_config.json", "rerun the run's training command")
        return _merged(_of_mix(identity.get("mix") or [], identity.get("local_files_sha256")))
    if kind == "config":
        return _merged(_of_mix([{**vars(s)} for s in load_config(data).mix]))
    if kind == "dataset":
        return {None: Sources(hub={(data, None, "")})}
    files = [Path(m) for part in data.split(",") if part.strip()
             for m in (expand_pattern(str(project_path(part.strip()))))]
    return {None: Sources(files={file_sha256(f): f.name for f in files if f.is_file()})}


def _merged(by_label: dict[str, Sources]) -> dict[str | None, Sources]:
    whole = Sources()
    for sources in by_label.values():
        whole.files.update(sources.files)
        whole.hub |= sources.hub
    return {None: whole}


def documents_trained_on(folder: Path | None, data: str, kind: str,
                         labels: list[str] | None, documents: int) -> tuple[int, list[str]] | None:
    """How many of the `documents` scored (each with its source label in `labels`, when the data records them) come
    from sources the model in `folder` was trained on, and those sources' names; None when the model records no
    training data. A Hub dataset scored is compared by id and subset only (its split is the evaluation's)."""
    trained = trained_sources(folder)
    if trained is None:
        return None
    if kind == "dataset":  # any split of a dataset it trained on
        trained = Sources(trained.files, {(name, subset, "") for name, subset, _ in trained.hub})
    scored = scored_sources(data, kind)
    shared = {label: trained.shared(sources) for label, sources in scored.items()}  # named as the run names them
    names = sorted({name for found in shared.values() for name in found})
    if None in scored:
        return (documents if shared[None] else 0), names
    return sum(1 for label in labels or [] if shared.get(label)), names

