"""Mix configs: the JSON schema shared by every script, its validation, and the errors users see.

A config is `{"seed", "context_length", "target_tokens", "mix": [{"name", "split", "prob", "data_files"?, "subset"?,
"text_field"?, "revision"?, "tokenizer"?}]}`. Every mistake raises ConfigError with the file, the JSON path
(`mix[2].prob`) and what is expected.

Instead of "mix", a config may give "phases": `[{"name"?, "share" | "tokens", "mix": [...]}]`, each phase a mix (its
entries as the top-level mix's) over its part of the run's training tokens, in order (an annealing phase at the end,
say). "share" is a fraction of the training tokens (the shares sum to 1); "tokens" a count of the config's
target_tokens (they sum to it, or the last phase omits it and takes the rest), kept as the share it is of
target_tokens, so that a run with another TARGET_TOKENS keeps the proportions. An entry that differs from another
phase's only in "prob" is the same source: one reader for the whole run, which goes on where it was at a boundary.
The loaded `MixConfig.mix` is then the union of the sources with their run-wide (token-weighted) probs, which
everything that opens, labels, checks or holds out validation documents from the sources reads; `MixConfig.phases`
says which probs hold where (a one-mix config is one phase), and `phase_ends` where each phase ends, in any unit.
"""

from __future__ import annotations

import difflib
import glob
import json
import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparknet.common.errors import UserError
from sparknet.common.runtime import file_sha256, project_path
from sparknet.config.checks import MIN_BLOCK, MIN_BLOCK_WHY, RULES
from sparknet.config.kinds import LOCAL_KINDS, LocalKind, local_file_columns, local_kind_of_file

log = logging.getLogger(__name__)

TOP_KEYS = ("seed", "context_length", "target_tokens", "mix", "phases")
REQUIRED_TOP_KEYS = ("seed", "context_length", "target_tokens")
PHASE_KEYS = ("name", "share", "tokens", "mix")
SOURCE_KEYS = ("name", "split", "prob", "data_files", "subset", "text_field", "revision", "tokenizer")
REQUIRED_SOURCE_KEYS = ("name", "prob")
COMMIT_SHA = re.compile(r"[0-9a-f]{40}")  # a full commit id, shortened in labels as git shortens it


class ConfigError(UserError):
    """A mix config that cannot be used; the message names the file and the JSON path."""


# How a source's label is made (recorded in every dataset's manifest, so that what a label meant stays with it)
LABEL_RULE = (f"for a local kind ({', '.join(LOCAL_KINDS)}) its first data file's stem (a glob's folder; a hidden "
              "file's name after its dot; the kind if that is empty), else the dataset id's last part; then /subset "
              "and @revision when set; control characters escaped (\\n); repeated labels numbered #1, #2, ...")


@dataclass(frozen=True)
class SourceSpec:
    """One mix entry: a Hub dataset id (or a local kind, `json`, `parquet`, `csv` or `text`, with `data_files`) and
    its share of the mix."""

    name: str
    prob: float
    split: str = "train"
    data_files: str | list[str] | dict[str, str | list[str]] | None = None
    subset: str | None = None
    text_field: str | None = None
    revision: str | None = None  # a Hub branch, tag or commit sha; None reads the default branch as it is now
    tokenizer: str | None = None  # a pre-tokenized source's tokenizer (folder or Hub id): must be the run's
    label: str = ""  # unique short name used in reports and accounting

    @property
    def local(self) -> LocalKind | None:
        """The kind of local files this entry reads (LOCAL_KINDS), or None for a Hub dataset (or a local folder
        named as a dataset)."""
        return LOCAL_KINDS.get(self.name)

    def resolved_data_files(self) -> list[str] | dict[str, list[str]] | None:
        """Data files with relative paths resolved against the project root, glob patterns kept as patterns."""
        if self.data_files is None:
            return None
        if isinstance(self.data_files, dict):
            return {k: [str(project_path(f)) for f in ([v] if isinstance(v, str) else v)]
                    for k, v in self.data_files.items()}
        files = [self.data_files] if isinstance(self.data_files, str) else self.data_files
        return [str(project_path(f)) for f in files]

    def data_file_patterns(self) -> list[str]:
        """Every resolved data_files entry, of every split of a dict, glob patterns kept as patterns."""
        files = self.resolved_data_files() or []
        return [f for group in (files.values() if isinstance(files, dict) else [files]) for f in group]


@dataclass(frozen=True)
class Phase:
    """One phase of a run: its name, its share of the run's training tokens, and the probs (normalised, by source
    label) of the sources it reads; a source it does not read is not in `probs`."""

    name: str
    share: float
    probs: tuple[tuple[str, float], ...]

    def prob_of(self) -> dict[str, float]:
        """The probs by label."""
        return dict(self.probs)


def phase_ends(shares: Sequence[float], total: int) -> list[int]:
    """Where each phase ends among `total` units (blocks of a packed split, optimizer steps, a stream's blocks): the
    cumulative shares times `total`, rounded to whole units, the last at `total` (a phase may get none)."""
    ends, cumulative = [], 0.0
    for share in shares[:-1]:
        cumulative += share
        ends.append(min(total, max(ends[-1] if ends else 0, round(cumulative * total))))
    return [*ends, total]


@dataclass(frozen=True)
class MixConfig:
    """A validated mix config; `mix` probabilities sum to 1 (with phases: the run-wide ones, token-weighted)."""

    seed: int
    context_length: int
    target_tokens: int
    mix: tuple[SourceSpec, ...]
    path: str = ""
    phases: tuple[Phase, ...] = ()  # left empty: one phase, the mix

    def __post_init__(self) -> None:
        if not self.phases:  # a one-mix config is one phase of the whole run
            object.__setattr__(self, "phases", (Phase("phase1", 1.0, tuple((s.label, s.prob) for s in self.mix)),))

    @property
    def phased(self) -> bool:
        """Whether the run has more than one phase."""
        return len(self.phases) > 1

    def phase_ends(self, total: int) -> list[int]:
        """Where each phase ends among `total` units (module-level `phase_ends`)."""
        return phase_ends([p.share for p in self.phases], total)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON data (for manifests, metadata and run identities); "phases" only where the run
        has several (a one-mix config's data is what it always was)."""
        d = asdict(self)
        # `revision` only where pinned (an entry without one reads the default branch, whose commit is recorded
        # beside the config as source_revisions), `tokenizer` only where given
        d["mix"] = [{k: v for k, v in s.items() if k not in ("revision", "tokenizer") or v is not None}
                    for s in d["mix"]]
        d.pop("phases")
        if self.phased:
            d["phases"] = [{"name": p.name, "share": p.share, "probs": dict(p.probs)} for p in self.phases]
        return d


def _whole(value: Any) -> Any:
    """A float holding a whole number (`1e9` in JSON) as an int, as the command line reads it; anything else as is."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _type_name(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


class _Checker:
    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, where: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {where}: {message}" if where else f"{self.path}: {message}")

    def keys(self, obj: dict[str, Any], where: str, allowed: tuple[str, ...], required: tuple[str, ...]) -> None:
        for key in obj:
            if key not in allowed:
                near = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                hint = f"; did you mean {near[0]!r}?" if near else f"; allowed keys: {', '.join(allowed)}"
                raise self.fail(f"{where}.{key}" if where else key, f"unknown key{hint}")
        for key in required:
            if key not in obj:
                raise self.fail(f"{where}.{key}" if where else key, "missing required key")

    def positive_int(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(where, f"expected a positive integer, got {json.dumps(value)} ({_type_name(value)})")
        return value

    def string(self, value: Any, where: str, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"expected a non-empty string, got {json.dumps(value)} ({_type_name(value)})")
        return value

    def data_files(self, value: Any, where: str) -> Any:
        def files(v: Any, w: str) -> list[str]:
            items = [v] if isinstance(v, str) else v
            if not isinstance(items, list) or not items or not all(isinstance(f, str) and f for f in items):
                raise self.fail(w, f"expected a file path or a non-empty list of paths, got {json.dumps(v)}")
            for f in items:
                full = project_path(f)
                if glob.has_magic(f):
                    matches = glob.glob(str(full))
                    if matches and not any(Path(m).is_file() for m in matches):
                        raise self.fail(w, f"data file pattern {f!r} matches only folders ({full}): name the files, "
                                        "e.g. folder/*.jsonl")
                    if not matches:
                        raise self.fail(w, f"data file pattern {f!r} matches no file (looked for {full}); relative "
                                        "paths are relative to the project root")
                elif full.is_dir():
                    raise self.fail(w, f"data file {f!r} is a folder ({full}): name the files in it, e.g. "
                                    f"{f.rstrip('/')}/*.jsonl")
                elif not full.is_file():
                    raise self.fail(
                        w,
                        f"data file {f!r} does not exist (looked for {full}); relative paths are "
                        "relative to the project root",
                    )
            return items

        if isinstance(value, dict):
            if not value:
                raise self.fail(where, "expected at least one split of files")
            for split, v in value.items():
                files(v, f"{where}.{split}")
            return value
        files(value, where)
        return value


def parse_config(data: Any, path: str = "<config>") -> MixConfig:
    """Validates already-parsed JSON data; raises ConfigError naming the JSON path of the first mistake."""
    check = _Checker(path)
    if not isinstance(data, dict):
        raise check.fail("", f"expected a JSON object with keys {', '.join(TOP_KEYS)}, got {_type_name(data)}")
    check.keys(data, "", TOP_KEYS, REQUIRED_TOP_KEYS)
    seed = _whole(data["seed"])
    # the rules of the constants SEED and BLOCK_SIZE (sparknet.config.checks), which these keys are the defaults of
    if not RULES["SEED"].test(seed):
        raise check.fail("seed", f"expected {RULES['SEED'].expected}, got {json.dumps(data['seed'])}")
    context_length = check.positive_int(_whole(data["context_length"]), "context_length")
    if not RULES["BLOCK_SIZE"].test(context_length):
        raise check.fail("context_length", f"expected {MIN_BLOCK} or more tokens, got {context_length}: "
                         f"{MIN_BLOCK_WHY}")
    # 1e9 is a whole number in JSON too, as it is on the command line
    target_tokens = check.positive_int(_whole(data["target_tokens"]), "target_tokens")
    if "mix" in data and "phases" in data:
        raise check.fail("phases", 'give "mix" (one mix for the whole run) or "phases", not both: move the mix into '
                         "a phase")
    if "phases" in data:
        sources, phases = _parse_phases(check, data["phases"], target_tokens)
    elif "mix" in data:
        raw_sources = _parse_mix(check, data["mix"], "mix")
        places = [f"mix[{i}]" for i in range(len(raw_sources))]
        _refuse_duplicates(check, raw_sources, places)
        _refuse_shared_files(check, raw_sources, places)
        sources, phases = _normalised_sources(check, raw_sources, "mix"), ()
    else:
        raise check.fail("mix", 'missing required key (or give "phases")')
    return MixConfig(seed=seed, context_length=context_length, target_tokens=target_tokens, mix=sources, path=path,
                     phases=phases)


def _parse_mix(check: _Checker, mix: Any, where_mix: str) -> list[dict[str, Any]]:
    """The entries of one mix (the top-level one or a phase's), checked, as plain dicts with their raw prob."""
    if not isinstance(mix, list):
        raise check.fail(where_mix, f"expected a list of sources, got {_type_name(mix)}")
    if not mix:
        raise check.fail(where_mix, "the mix is empty: add at least one source")

    raw_sources = []
    for i, entry in enumerate(mix):
        where = f"{where_mix}[{i}]"
        if not isinstance(entry, dict):
            raise check.fail(where, f"expected an object with keys name, prob, ..., got {_type_name(entry)}")
        check.keys(entry, where, SOURCE_KEYS, REQUIRED_SOURCE_KEYS)
        name = check.string(entry["name"], f"{where}.name")
        prob = entry["prob"]
        if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not math.isfinite(prob) or prob <= 0:
            raise check.fail(f"{where}.prob", f"expected a finite number > 0, got {json.dumps(prob)}")
        split = check.string(entry.get("split", "train"), f"{where}.split")
        subset = check.string(entry.get("subset"), f"{where}.subset", optional=True)
        text_field = check.string(entry.get("text_field"), f"{where}.text_field", optional=True)
        revision = check.string(entry.get("revision"), f"{where}.revision", optional=True)
        tokenizer = check.string(entry.get("tokenizer"), f"{where}.tokenizer", optional=True)
        local = LOCAL_KINDS.get(name)
        if local and subset is not None:
            raise check.fail(f"{where}.subset", f'a "{name}" source has no subsets: remove "subset" (use data_files)')
        if local and revision is not None:
            # datasets would silently ignore it; local files are pinned by their sha256 in the dataset inputs
            raise check.fail(f"{where}.revision", f'a "{name}" source has no revisions: remove "revision" (local '
                             "files are pinned by their sha256)")
        data_files = entry.get("data_files")
        if data_files is not None:
            data_files = _normalised(check.data_files(data_files, f"{where}.data_files"))
        elif local:
            raise check.fail(f"{where}.data_files", f'a "{name}" source needs "data_files": the local {local.files} '
                             "file(s)")
        raw = dict(name=name, prob=float(prob), split=split, data_files=data_files, subset=subset,
                   text_field=text_field, revision=revision, tokenizer=tokenizer)
        if local:
            _check_file_kinds(check, raw, where)
            _check_text_field(check, raw, where)
        raw_sources.append(raw)
    return raw_sources


def _check_file_kinds(check: _Checker, source: dict[str, Any], where: str) -> None:
    """A file whose suffix is another local kind's (a CSV matched by a text entry's glob) would be read as this
    entry's kind without a word: a CSV as one plain document, a text file as broken JSON. Refused, naming the file.
    A suffix no kind has (.py, .log) is read as the entry's kind."""
    for named, real in local_files(source):
        kind = local_kind_of_file(real)
        if kind is not None and kind != source["name"]:
            theirs, ours = LOCAL_KINDS[kind].files, LOCAL_KINDS[source["name"]].files
            raise check.fail(f"{where}.data_files", f"{named!r} names {real}, a {theirs} file, in a "
                             f"\"{source['name']}\" entry that would read it as {ours}: name only "
                             f"{source['name']} files here (e.g. *{LOCAL_KINDS[source['name']].suffixes[0]}), and give "
                             f"the {kind} files an entry of their own (\"name\": \"{kind}\")")


def _check_text_field(check: _Checker, source: dict[str, Any], where: str) -> None:
    """A text_field that is not a column of a local file is refused now, as a key's typo is, not seconds into a
    build: each file's columns are read cheaply (`local_file_columns`)."""
    field = source["text_field"]
    if field is None:
        return
    for _named, real in local_files(source):
        columns = local_file_columns(source["name"], real)
        if columns is not None and field not in columns:
            near = difflib.get_close_matches(field, columns, n=1, cutoff=0.6)
            hint = f": did you mean {near[0]!r}?" if near else ": name the column that holds the text"
            found = ", ".join(columns[:20]) + (", ..." if len(columns) > 20 else "") or "none"
            raise check.fail(f"{where}.text_field", f"{field!r} is not a column of {real} (columns: {found}){hint}")


def _normalised_sources(check: _Checker, raw_sources: list[dict[str, Any]], where: str) -> tuple[SourceSpec, ...]:
    """The sources, labelled, their probs normalised to sum to 1 (a warning when they did not)."""
    total = sum(s["prob"] for s in raw_sources)
    if not math.isfinite(total):
        raise check.fail(where, "the probabilities are too large to add up; use shares such as 0.5, 0.3, 0.2")
    labels = _labels(raw_sources)
    sources = tuple(
        SourceSpec(**{**s, "prob": s["prob"] / total}, label=label)
        for s, label in zip(raw_sources, labels, strict=True)
    )
    if abs(total - 1.0) > 1e-9:
        shares = ", ".join(f"{s.label}={s.prob:.4f}" for s in sources)
        log.warning("%s: probabilities sum to %g, normalised to %s", check.path, total, shares)
    return sources


def _parse_phases(check: _Checker, phases: Any, target_tokens: int) -> tuple[tuple[SourceSpec, ...],
                                                                              tuple[Phase, ...]]:
    """The union of the phases' sources (run-wide probs: each phase's weighted by its share) and the phases."""
    if not isinstance(phases, list):
        raise check.fail("phases", f"expected a list of phases, got {_type_name(phases)}")
    if not phases:
        raise check.fail("phases", 'no phases: give at least one, or a top-level "mix"')
    names: dict[str, int] = {}
    shares: list[float | None] = []
    mixes: list[list[dict[str, Any]]] = []
    for i in range(len(phases)):
        name, share, mix = _parse_phase(check, phases, i, names, target_tokens)
        names[name] = i
        shares.append(share)
        mixes.append(mix)
    whole = _whole_shares(check, phases, shares, target_tokens)
    return _phase_union(check, list(names), whole, mixes)


def _parse_phase(check: _Checker, phases: list[Any], i: int, names: dict[str, int],
                 target_tokens: int) -> tuple[str, float | None, list[dict[str, Any]]]:
    """Phase `i`'s name, share of the training tokens (None: the last phase of phases given in tokens, which takes
    the rest) and mix."""
    phase, where = phases[i], f"phases[{i}]"
    if not isinstance(phase, dict):
        raise check.fail(where, f"expected an object with keys {', '.join(PHASE_KEYS)}, got {_type_name(phase)}")
    check.keys(phase, where, PHASE_KEYS, ("mix",))
    name = check.string(phase.get("name", f"phase{i + 1}"), f"{where}.name")
    if name in names:
        raise check.fail(f"{where}.name", f"{name!r} is also phases[{names[name]}]'s name: give each phase its own")
    if "share" in phase and "tokens" in phase:
        raise check.fail(where, 'give "share" (a fraction of the training tokens) or "tokens", not both')
    share: float | None
    if "share" in phase:
        share = phase["share"]
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise check.fail(f"{where}.share", f"expected a fraction of the training tokens in (0, 1], got "
                             f"{json.dumps(share)}")
        share = float(share)
    elif "tokens" in phase:
        share = check.positive_int(_whole(phase["tokens"]), f"{where}.tokens") / target_tokens
    elif i == len(phases) - 1 and i > 0 and "tokens" in phases[0]:
        share = None  # the rest of target_tokens
    else:
        raise check.fail(f"{where}.share", 'missing: give "share" (a fraction of the training tokens) or '
                         '"tokens" (only the last phase of phases given in tokens may omit it: it takes the rest)')
    return name, share, _parse_mix(check, phase["mix"], f"{where}.mix")


def _whole_shares(check: _Checker, phases: list[Any], shares: list[float | None], target_tokens: int) -> list[float]:
    """The phases' shares checked to divide the training tokens: all shares summing to 1, or all tokens summing to
    target_tokens (the last phase's left out: the rest)."""
    by_tokens = ["tokens" in p for p in phases[:len(phases) - (shares[-1] is None)]]
    if any(by_tokens) and not all(by_tokens):
        first = by_tokens.index(not by_tokens[0])
        raise check.fail(f"phases[{first}]", 'phases give "share" and "tokens" mixed: give every phase a share, or '
                         "every phase tokens")
    given = sum(s for s in shares if s is not None)
    if shares[-1] is None:
        rest = target_tokens - round(given * target_tokens)
        if rest <= 0:
            taken = round(given * target_tokens)
            raise check.fail(f"phases[{len(phases) - 1}]", f"the phases before it take {taken:,} "
                             f"tokens, all of target_tokens ({target_tokens:,}): nothing is left for the last phase")
        shares = [*shares[:-1], rest / target_tokens]
    elif by_tokens[0] and round(given * target_tokens) != target_tokens:
        raise check.fail("phases", f"the phases' tokens sum to {round(given * target_tokens):,}, not target_tokens "
                         f"({target_tokens:,}): make them add up, or leave out the last phase's to give it the rest")
    elif abs(given - 1.0) > 1e-6:
        raise check.fail("phases", f"the phases' shares sum to {given:g}, not 1: they divide the training tokens")
    return [float(s) for s in shares if s is not None]


def _phase_union(check: _Checker, names: list[str], shares: list[float],
                 mixes: list[list[dict[str, Any]]]) -> tuple[tuple[SourceSpec, ...], tuple[Phase, ...]]:
    """One source per identity (an entry the same as another phase's apart from its prob is that source), with the
    run-wide probs; and the phases, each its probs by label."""
    union: list[dict[str, Any]] = []
    places: list[str] = []
    index_of: dict[str, int] = {}
    phase_probs: list[dict[int, float]] = []
    for i, mix in enumerate(mixes):
        _refuse_duplicates(check, mix, [f"phases[{i}].mix[{j}]" for j in range(len(mix))])
        total = sum(entry["prob"] for entry in mix)
        if not math.isfinite(total):
            raise check.fail(f"phases[{i}].mix", "the probabilities are too large to add up; use shares such as 0.5, "
                             "0.3, 0.2")
        probs: dict[int, float] = {}
        for j, entry in enumerate(mix):
            key = _source_identity(entry)
            if key not in index_of:
                index_of[key] = len(union)
                union.append({**entry, "prob": 0.0})
                places.append(f"phases[{i}].mix[{j}]")
            k = index_of[key]
            # the identity covers every key but prob and tokenizer (data files compared resolved: `a//b` is `a/b`)
            if entry["tokenizer"] != union[k]["tokenizer"]:
                raise check.fail(f"phases[{i}].mix[{j}].tokenizer", f"the same source as {places[k]} with another "
                                 f"tokenizer ({json.dumps(entry['tokenizer'])}, there "
                                 f"{json.dumps(union[k]['tokenizer'])}): a source is the same in every phase apart "
                                 "from its prob")
            probs[k] = entry["prob"] / total
        phase_probs.append(probs)
    _refuse_shared_files(check, union, places)
    for share, probs in zip(shares, phase_probs, strict=True):
        for k, prob in probs.items():
            union[k]["prob"] += share * prob
    labels = _labels(union)
    total = sum(s["prob"] for s in union)  # 1, up to the rounding of the shares
    sources = tuple(SourceSpec(**{**s, "prob": s["prob"] / total}, label=label)
                    for s, label in zip(union, labels, strict=True))
    out = tuple(Phase(name, share, tuple((labels[k], prob) for k, prob in probs.items()))
                for name, share, probs in zip(names, shares, phase_probs, strict=True))
    return sources, out


def _normalised(data_files: Any) -> Any:
    """Data files with each path normalised (`DIR//a/../b.jsonl` is `DIR/b.jsonl`), so the same files typed two
    ways are the same dataset inputs."""
    if isinstance(data_files, dict):
        return {k: _normalised(v) for k, v in data_files.items()}
    if isinstance(data_files, list):
        return [_normalised(f) for f in data_files]
    return data_files if "://" in data_files else os.path.normpath(data_files)  # normpath would break a URL


def _source_identity(source: dict[str, Any]) -> str:
    """What makes two entries the same data: name, subset, split, data files (resolved, so `a//b` is `a/b`) and
    revision (two revisions of a dataset are two sources; no revision and `main` count as different, as the default
    branch need not be `main` and cannot be asked offline)."""
    files = source["data_files"]
    if files is not None:
        spec = SourceSpec(name=source["name"], prob=1.0, data_files=files)
        resolved = spec.resolved_data_files()
        if isinstance(resolved, dict):
            files = {k: sorted(v) for k, v in sorted(resolved.items())}
        else:
            files = sorted(resolved or [])
    return json.dumps([source["name"], source["subset"], source["split"], files, source["revision"],
                       source["text_field"]], sort_keys=True)


def expand_pattern(path: str) -> list[str]:
    """The files a data_files entry names: a glob pattern's matches (sorted), else the path itself."""
    return sorted(glob.glob(path)) if glob.has_magic(path) else [path]


def local_files(source: dict[str, Any]) -> list[tuple[str, str]]:
    """(the file as the config names it, its real path) for every local file the entry reads, globs expanded; a
    `data_files` dict contributes its `split`'s files (all of them when the split is not among its keys)."""
    files = source["data_files"]
    if files is None:
        return []
    if isinstance(files, dict):
        files = files.get(source["split"], [f for v in files.values() for f in ([v] if isinstance(v, str) else v)])
    out = []
    for f in [files] if isinstance(files, str) else files:
        for path in expand_pattern(str(project_path(f))):
            if Path(path).is_file():  # a Hub repository's own data_files are not local
                out.append((f, os.path.realpath(path)))
    return out


def _refuse_shared_files(check: _Checker, sources: list[dict[str, Any]], places: list[str]) -> None:
    """A local file read by two entries (or twice by one, through a glob or another spelling) puts its documents
    in the data twice, and one reading's validation documents in the other's training. Two entries reading other
    columns of one file (`text_field`) are two sources."""
    seen: dict[tuple[str, str | None], tuple[int, str]] = {}
    for i, source in enumerate(sources):
        for named, real in local_files(source):
            key = (real, source["text_field"])
            if key in seen:
                j, first = seen[key]
                where = (f"twice in {places[i]}.data_files (as {first!r} and {named!r})" if j == i else
                         f"in {places[j]} (as {first!r}) and in {places[i]} (as {named!r})")
                raise check.fail(f"{places[i]}.data_files", f"the file {real} is {where}: its documents would be read "
                                 "twice, and validation documents trained on; list each file in one entry, once")
            seen[key] = (i, named)
    _refuse_same_content(check, sources, places)


def _refuse_same_content(check: _Checker, sources: list[dict[str, Any]], places: list[str]) -> None:
    """A copy or a hard link of a local file, under another name, puts its documents in the data twice just as the
    same file does. Files are compared by size first, so only files of equal size are read (and hashed). Within one
    entry of a kind whose files are whole documents (text) two equal files are a repeated document, as two equal
    rows of a JSONL file are, and empty files hold nothing."""
    by_size: dict[tuple[int, str | None], list[tuple[int, str, str]]] = {}
    for i, source in enumerate(sources):
        for named, real in dict.fromkeys(local_files(source)):
            size = os.path.getsize(real)
            if size:
                by_size.setdefault((size, source["text_field"]), []).append((i, named, real))
    for group in by_size.values():
        seen: dict[str, tuple[int, str]] = {}
        for i, _named, real in group if len(group) > 1 else ():
            key = file_sha256(real)
            kind = LOCAL_KINDS.get(sources[i]["name"])
            repeated_document = key in seen and seen[key][0] == i and kind is not None and kind.whole_files
            if key in seen and not repeated_document:
                j, first = seen[key]
                where = f"in {places[j]}" if j != i else "in the same entry"
                raise check.fail(f"{places[i]}.data_files", f"the file {real} has the same content as {first} "
                                 f"{where} (a copy or a link): its documents would be read twice, and validation "
                                 "documents trained on; list one of them, once")
            seen[key] = (i, real)


def _refuse_duplicates(check: _Checker, sources: list[dict[str, Any]], places: list[str]) -> None:
    """A source listed twice (in one mix) would be read twice: every document twice in the dataset."""
    first: dict[str, int] = {}
    for i, source in enumerate(sources):
        key = _source_identity(source)
        if key in first:
            pinned = f", revision {source['revision']!r}" if source["revision"] else ""
            raise check.fail(
                places[i],
                f"the same source as {places[first[key]]} ({source['name']}, split {source['split']!r}{pinned}): list "
                "each source once and give it the sum of the probs",
            )
        first[key] = i


def _labels(sources: list[dict[str, Any]]) -> list[str]:
    """Short unique names (LABEL_RULE): the dataset id's last part, or for a local kind its first file's stem (`prose`
    for data/prose.jsonl or data/prose.parquet; for a glob, its folder: `prose` for data/prose/*.txt), then
    `/subset` and `@revision` (a commit sha cut to 7 characters, as git shows it) when set, so that reports say which
    revision a source reads and two revisions of one dataset are told apart."""
    labels = []
    for s in sources:
        if s["name"] in LOCAL_KINDS and s["data_files"] is not None:
            first = s["data_files"]
            while not isinstance(first, str):
                first = next(iter(first.values())) if isinstance(first, dict) else first[0]
            # a glob's files are named by their folder (`prose` for data/prose/*.txt)
            # a hidden file's stem is its name after the dot (`hid` for .hid.jsonl), never empty
            label = ((Path(first).parent.name if glob.has_magic(Path(first).name) else
                      Path(first).name.lstrip(".").split(".")[0]) or s["name"])
        else:
            label = s["name"].rstrip("/").split("/")[-1] or s["name"]
        if s["subset"]:
            label += f"/{s['subset']}"
        if s["revision"]:
            revision = s["revision"]
            label += "@" + (revision[:7] if COMMIT_SHA.fullmatch(revision) else revision)
        labels.append(printable(label))
    counts = {lab: labels.count(lab) for lab in labels}
    taken = {lab for lab in labels if counts[lab] == 1}  # unique labels stay as they are
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        if counts[lab] > 1:
            # number the repeats, skipping any number another label already holds (`a#1` from a#1.jsonl)
            while True:
                seen[lab] = seen.get(lab, 0) + 1
                candidate = f"{lab}#{seen[lab]}"
                if candidate not in taken:
                    break
            taken.add(candidate)
            lab = candidate
        out.append(lab)
    return out


def printable(text: str) -> str:
    """`text` with every control or other unprintable character written as its Python escape (`\\n`, `\\x1b`):
    a label is written into tables, log lines, TensorBoard tags and the card, where a newline would break a row."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def load_config(path: str | Path) -> MixConfig:
    """Reads and validates a mix config file (relative paths are relative to the project root)."""
    full = project_path(path)
    shown = str(path)
    if not full.is_file():
        hint = ""
        configs = sorted(p.name for p in project_path("configs").glob("*.json"))
        if configs:
            hint = f"; configs shipped: {', '.join('configs/' + c for c in configs)}"
        raise ConfigError(f"config file {shown} not found (looked for {full}){hint}")
    try:
        text = full.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{shown}: cannot read the file: {exc}") from None
    try:
        data = json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
    except json.JSONDecodeError as exc:
        problem = exc.msg.lower()
        raise ConfigError(f"{shown}: invalid JSON ({problem}) at line {exc.lineno}, column {exc.colno}") from None
    except _DuplicateKey as exc:
        raise ConfigError(f"{shown}: key {exc.args[0]!r} appears twice in one object: keep one") from None
    return parse_config(data, shown)


class _DuplicateKey(Exception):
    """A key given twice in one JSON object (json.loads would silently keep the last)."""


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out
