"""The documents an evaluation scores, as text, so that any model, whatever its tokenizer, scores the same bytes.

`DATA` may name:
- a packed dataset folder (its `manifest.json`): a split decoded back to documents;
- a streaming run's validation blocks (`checkpoints/RUN/val_blocks.npy`, what the run evaluated on: about its
  VAL_TOKENS), decoded the same way with the run's tokenizer;
  a validation split's documents are where its record says each item starts (the manifest's `splits.val.
  item_starts`, the run's `val_report.json`): a document cut at its source's cap ends where a block ends, with no
  <|endoftext|>, so cutting at <|endoftext|> would glue it to the next ones. Each is labelled with its source (the
  tokens' sources, val_sources). A split without such a record (a training split, a dataset or run made before
  the record) is cut at <|endoftext|>, with a warning where that may glue documents;
- a mix config (`configs/*.json`): the rows each source held out for validation in a streaming run among the
  models (its `val_report.json`), or the first `holdout_rows` rows of each source;
- a Hub dataset id, or a local folder of data files `datasets` can load: one split (`subset`, `split`), streamed;
- JSONL or text files (a glob or a comma-separated list): one document per JSON line, or per file.
"""

from __future__ import annotations

import functools
import glob
import itertools
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sparknet.common.errors import UserError
from sparknet.common.runtime import read_json_object
from sparknet.config.kinds import LOCAL_KINDS, local_kind_of_file
from sparknet.config.mix import SourceSpec
from sparknet.run_files import RUN_CONFIG, VAL_BLOCKS, VAL_REPORT, read_val_blocks, read_val_report

log = logging.getLogger("sparknet.eval")

# `name` or `owner/name`, as the Hub spells dataset ids.
_HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
_FILE_SUFFIXES = tuple(suffix for kind in LOCAL_KINDS.values() for suffix in kind.suffixes)


@dataclass
class DataRequest:
    """What to score: `data` as typed, and the settings that apply to some kinds of it."""

    data: str
    text_field: str = "text"
    split: str = "val"
    subset: str | None = None
    max_documents: int = 0
    holdout_rows: int = 0
    runs: list[Path] = field(default_factory=list)  # model folders whose recorded hold-out a mix config can use
    # the tokenizer (folder or Hub id) that turns a pre-tokenized source's ids back into text (None: refused)
    decode_with: str | None = None


def data_kind(data: str) -> str:
    """"packed", "blocks", "config", "dataset" (a Hub id or a local folder of data files) or "files"."""
    from sparknet.common.runtime import project_path

    path = project_path(data)
    if path.is_file() and path.suffix == ".npy":
        return "blocks"
    if path.is_dir():
        return "packed" if (path / "manifest.json").is_file() else "dataset"
    if path.is_file() and path.suffix == ".json" and _is_mix_config(path):
        return "config"
    # a missing `datasets/demo2` is a mistyped local path (its first folder is here), not a Hub id
    local_parent = "/" in data and project_path(data.split("/")[0]).is_dir()
    if (not path.exists() and _HUB_ID.match(data) and not data.endswith(_FILE_SUFFIXES) and "," not in data
            and not local_parent):
        return "dataset"
    return "files"


def load_documents(request: DataRequest | str) -> list[str]:
    """The non-empty texts to score (the first `max_documents` when set)."""
    return load_labelled_documents(request)[0]


def load_labelled_documents(request: DataRequest | str) -> tuple[list[str], list[str] | None]:
    """`load_documents`' texts, and the mix source label of each where the data records one (a packed dataset's
    validation split: its tokens' sources), else None: runs trained on different mixes compare per source on it."""
    request = DataRequest(request) if isinstance(request, str) else request
    if not request.data:
        raise UserError("no data: set DATA to a packed dataset folder, a mix config, a Hub dataset, or JSONL/text "
                        "files")
    kind = data_kind(request.data)
    limit = request.max_documents
    labels = None
    if kind == "packed":
        texts, labels = _packed_documents(request)
    elif kind == "blocks":
        texts, labels = _blocks_documents(request)
    elif kind == "config":
        texts = _config_documents(request)
    elif kind == "dataset":
        texts = _dataset_documents(request)
    else:
        texts = _file_documents(request)
    kept = [i for i, t in enumerate(texts) if t]
    texts = [texts[i] for i in kept]
    labels = [labels[i] for i in kept] if labels is not None else None
    if not texts:
        raise UserError(f"{request.data}: no non-empty documents found")
    if limit:
        texts, labels = texts[:limit], labels[:limit] if labels is not None else None
    return texts, labels


def trained_on(folder: Path | None, spec: str) -> str:
    """The held-out data of a SparkNet run, as DATA would name it: its packed dataset (whose val split is scored),
    or (streaming) its validation blocks in the run folder, from its training_metadata.json. UserError for a model
    without one (a Hub id, an export)."""
    from sparknet.common.runtime import PROJECT_ROOT
    from sparknet.run_files import read_metadata, run_of

    metadata = read_metadata(folder) if folder is not None else None
    if metadata is not None:
        blocks = run_of(folder) / VAL_BLOCKS
        named = metadata.get("dataset", {}).get("path") or (str(blocks) if blocks.is_file() else None) or \
            metadata.get("config", {}).get("path")
        if named:  # shown relative to the project, as a user would type it
            inside = Path(named).is_relative_to(PROJECT_ROOT)
            return str(Path(named).relative_to(PROJECT_ROOT)) if inside else str(named)
    raise UserError(f"{spec}: no DATA given and no training_metadata.json naming its data: set DATA")


def check_unchanged(folder: Path | None, source: str) -> None:
    """When `source` is the packed dataset the run in `folder` was trained on, its validation split must still be
    the one the run held out: a folder rebuilt since with other inputs holds another. A dataset grown since (or
    rebuilt at another size), its inputs the same but TARGET_TOKENS, holds the same validation split byte for byte
    (the hold-out comes first and does not depend on the size: data/packed/build.py), so it is scored."""
    from sparknet.common.runtime import project_path
    from sparknet.config.identity import describe_changes
    from sparknet.data.packed.dataset import read_manifest
    from sparknet.run_files import read_metadata

    metadata = read_metadata(folder) if folder is not None else None
    recorded = (metadata or {}).get("dataset", {})
    if not recorded.get("path") or Path(recorded["path"]).resolve() != project_path(source).resolve():
        return
    manifest = read_manifest(project_path(source)) or {}
    if recorded.get("inputs") is not None and _but_size(manifest.get("inputs")) != _but_size(recorded["inputs"]):
        changes = "; ".join(describe_changes(recorded["inputs"], manifest.get("inputs") or {})) or "inputs differ"
        raise UserError(f"{source} was rebuilt since {folder.name} was trained on it ({changes}): its validation "
                        "split is not the text the run held out. Rebuild it with the run's inputs, or pass DATA to "
                        "score other data knowingly")


def _but_size(inputs: dict[str, Any] | None) -> dict[str, Any] | None:
    """A dataset's inputs less its training size: what its validation split depends on."""
    return None if inputs is None else {key: value for key, value in inputs.items() if key != "target_tokens"}


def is_runs_hold_out(folder: Path | None, data: str, split: str) -> bool:
    """Whether `data` is a packed dataset whose validation split is, token for token, the hold-out of the streaming
    run in `folder` (the same config, tokenizer, VAL_TOKENS, SHUFFLE_BUFFER and seed: the build is the stream
    written to disk): what it never trained on (its training dropped any repeat of those documents)."""
    from sparknet.common.runtime import project_path
    from sparknet.data.packed.dataset import PackedDataset
    from sparknet.run_files import run_of

    if folder is None or split != "val" or data_kind(data) != "packed":
        return False
    run = run_of(folder)
    try:
        identity = json.loads((run / RUN_CONFIG).read_text(encoding="utf-8"))
        blocks = read_val_blocks(run / VAL_BLOCKS)
        dataset = PackedDataset(project_path(data), "val")
    except (OSError, ValueError, UserError):
        return False
    return (isinstance(identity, dict) and identity.get("tokenizer_sha256") == dataset.manifest["tokenizer"]["sha256"]
            and np.array_equal(np.asarray(dataset.tokens), blocks))


def _is_mix_config(path: Path) -> bool:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and "mix" in data


def _file_documents(request: DataRequest) -> list[str]:
    from sparknet.common.runtime import project_path

    files: list[Path] = []
    for part in (p.strip() for p in request.data.split(",") if p.strip()):
        matches = sorted(glob.glob(str(project_path(part)))) if any(c in part for c in "*?[") else []
        if not matches and not project_path(part).is_file():
            raise UserError(f"data file {part} not found (looked for {project_path(part)}); DATA may also be a "
                            "packed dataset folder, a mix config or a Hub dataset id")
        files += [Path(m) for m in matches] or [project_path(part)]
    texts: list[str] = []
    # read as the build reads a source of the files' kind (sparknet.config.kinds.LOCAL_KINDS; any other file is one
    # document of plain text), consecutive files of one kind as one source
    for kind, group in itertools.groupby(files, key=lambda path: local_kind_of_file(path.name) or "text"):
        paths = [str(path) for path in group]
        texts += _source_documents(SourceSpec(name=kind, prob=1.0, data_files=paths, label=Path(paths[0]).name,
                                              text_field=None if LOCAL_KINDS[kind].whole_files
                                              else _text_field(request)), request)
    return texts


def _source_documents(spec: SourceSpec, request: DataRequest) -> list[str]:
    """The texts of one source, streamed: only the documents scored are read. A pre-tokenized source's ids are
    decoded with `request.decode_with`'s tokenizer (the models' own), so that each model encodes the same text."""
    from sparknet.data.source.hub_retries import iter_texts

    texts = iter_texts(spec, _decoder(spec, request))
    return list(itertools.islice(texts, request.max_documents)) if request.max_documents else list(texts)


def _text_field(request: DataRequest) -> str | None:
    """The text column asked for; the default ("text") as the build's automatic choice, which takes "text" first
    and recognises a pre-tokenized source."""
    return None if request.text_field == "text" else request.text_field


def _decoder(spec: SourceSpec, request: DataRequest) -> Callable[[], Any] | None:
    """What decodes a pre-tokenized source's ids (loaded only when one is met): the tokenizer the mix entry records
    (its "tokenizer"), else the first model's, said once; None: no model, such a source is refused."""
    name = spec.tokenizer or request.decode_with
    if name is None:
        return None
    said = []

    def tokenizer() -> Any:
        if not said and spec.tokenizer is None:
            log.warning("source %r is pre-tokenized and records no tokenizer: its ids are decoded with %s's; if "
                        "they were made with another, give that one as the mix entry's \"tokenizer\"", spec.label,
                        name)
            said.append(True)
        return _tokenizer(name)

    return tokenizer


@functools.cache
def _tokenizer(name: str) -> Any:
    from sparknet.tokenizer import load_tokenizer

    return load_tokenizer(name)


def _packed_documents(request: DataRequest) -> tuple[list[str], list[str] | None]:
    """A split's documents, and each one's source label when the split records its tokens' sources."""
    from sparknet.common.runtime import project_path
    from sparknet.data.packed.dataset import PackedDataset
    from sparknet.tokenizer import load_tokenizer

    dataset = PackedDataset(project_path(request.data), request.split)
    tokenizer = load_tokenizer(dataset.manifest["tokenizer"]["path"])
    dataset.verify(len(tokenizer))  # the bytes the build wrote, ids within the vocabulary
    starts = dataset.manifest["splits"][request.split].get("item_starts")
    if starts is None and request.split == "val":
        log.warning("%s records no item starts (built before they were recorded): its validation documents are cut "
                    "at <|endoftext|>, which glues a document cut at its cap to the next; rebuild it to score each "
                    "document on its own", request.data)
    return _items(np.asarray(dataset.tokens), starts, dataset.source_ids, dataset.source_labels, tokenizer)


def _blocks_documents(request: DataRequest) -> tuple[list[str], list[str] | None]:
    """A streaming run's validation blocks, with the tokenizer of the run folder that holds them, cut where its
    report says items start, each labelled with its source (VAL_SOURCES beside them)."""
    from sparknet.common.runtime import project_path
    from sparknet.tokenizer import load_tokenizer

    path = project_path(request.data)
    if not (path.parent / "tokenizer.json").is_file():
        raise UserError(f"{request.data}: blocks are read with the tokenizer of the run folder beside them, and "
                        f"{path.parent} holds none: pass checkpoints/RUN_NAME/{VAL_BLOCKS} of a finished run")
    try:
        blocks = read_val_blocks(path)
    except ValueError as exc:
        raise UserError(f"{path} is damaged ({exc}): restore it from a backup of the run (it is the run's "
                        "validation hold-out, made once when the run began)") from None
    report, sources, labels = _run_record(path.parent, blocks)
    starts = report.get("item_starts") if report is not None else None
    if starts is None:
        log.warning("%s records no item starts (a run from before they were recorded): its documents are cut at "
                    "<|endoftext|>, which glues a document cut at its cap to the next", path.parent / VAL_REPORT)
    return _items(blocks, starts, sources, labels, load_tokenizer(str(path.parent)))


def _run_record(run: Path, blocks: np.ndarray) -> tuple[dict[str, Any] | None, np.ndarray | None, list[str]]:
    """A streaming run's VAL_REPORT and its blocks' token sources (VAL_SOURCES), where they are whole and of these
    blocks; (None, None, []) or (report, None, []) where not (the documents are then not labelled)."""
    from sparknet.run_files import VAL_SOURCES

    try:
        report = read_val_report(run / VAL_REPORT) if (run / VAL_REPORT).is_file() else None
    except ValueError:
        return None, None, []
    if report is None or report.get("blocks") != len(blocks) or not (run / VAL_SOURCES).is_file():
        return (report if report is not None and report.get("blocks") == len(blocks) else None), None, []
    try:
        sources = read_val_blocks(run / VAL_SOURCES, blocks.shape[1], len(blocks))
    except ValueError:
        return report, None, []
    labels = list(report.get("source_labels") or [])
    if sources.size and int(sources.max()) >= len(labels):
        return report, None, []
    return report, sources, labels


def _items(tokens: np.ndarray, starts: list[int] | None, source_ids: np.ndarray | None, source_labels: list[str],
           tokenizer: Any) -> tuple[list[str], list[str] | None]:
    """Token blocks back to documents: the flat tokens cut at each item's start (`starts`; None: after each
    <|endoftext|>), each without its <|endoftext|>, and each one's source label (the source of its first token)
    when `source_ids` are given, else None."""
    flat = np.asarray(tokens).reshape(-1).astype(np.int64)
    eos = tokenizer.eos_token_id
    if starts is None:
        starts = [0, *(np.flatnonzero(flat == eos) + 1).tolist()]
    cuts = sorted({int(start) for start in starts if 0 <= int(start) < len(flat)} | {0})
    pieces = np.split(flat, cuts[1:])
    # an item's own <|endoftext|> ends it (only the appended one: a literal in a document is text, other ids)
    texts = [tokenizer.decode((piece[:-1] if len(piece) and piece[-1] == eos else piece).tolist())
             for piece in pieces]
    if source_ids is None:
        return texts, None
    ids = np.asarray(source_ids).reshape(-1)
    return texts, [source_labels[int(ids[start])] for start in cuts]


def _dataset_documents(request: DataRequest) -> list[str]:
    """One split of a Hub dataset (or a local folder `datasets` loads like one), streamed: only the documents
    scored are read."""
    from sparknet.common.runtime import project_path

    local = project_path(request.data)
    name = str(local) if local.is_dir() else request.data
    return _source_documents(SourceSpec(name=name, prob=1.0, split=request.split, subset=request.subset,
                                        text_field=_text_field(request), label=request.data), request)


def _config_documents(request: DataRequest) -> list[str]:
    """The rows each source of the mix held out for validation (never trained on; of a document the hold-out cut,
    the start it took), read in the source's order;
    the sources' documents interleaved so that the first MAX_DOCUMENTS cover every source."""
    from sparknet.config.mix import load_config
    from sparknet.data.source.opening import decoded
    from sparknet.data.source.rank_reader import SourceReader

    config = load_config(request.data)
    rows, cut, run = _held_out_rows(config, request)
    start = _start_of(run) if any(cut.values()) else None
    per_source = []
    for spec in config.mix:
        texts = []
        tokenizer = _decoder(spec, request)
        vocab = (lambda tokenizer=tokenizer: len(tokenizer())) if tokenizer is not None else None
        for text, read in SourceReader(spec, vocab_size=vocab):
            if read > rows[spec.label]:
                break
            text = decoded(text, tokenizer)
            if read - 1 in cut[spec.label]:  # a document the hold-out cut: only its start was held out
                text = start(text, cut[spec.label][read - 1])
            texts.append(text)
        per_source.append(texts)
    return [t for group in itertools.zip_longest(*per_source) for t in group if t is not None]


def _check_files_unchanged(identity: dict[str, Any], config: Any, run: Path, data: str) -> None:
    """The mix's local files must be the ones the streaming run in `run` held its rows out of (the sha256 of each,
    recorded in its run_config.json): an edited file's first rows are other documents, so the held-out rows counted
    from its start would be other text. One line naming the first file that differs (or that came or went)."""
    from sparknet.config.identity import local_files_fingerprint

    then = identity.get("local_files_sha256")
    if not isinstance(then, dict):  # a run that recorded no fingerprint: nothing to compare
        return
    now = local_files_fingerprint(config)
    changed = [path for path in sorted(set(then) | set(now)) if then.get(path) != now.get(path)]
    if not changed:
        return
    path = changed[0]
    what = ("is gone" if path not in now else "was added" if path not in then else
            f"changed (sha256 {then[path][:12]}... then, {now[path][:12]}... now)")
    more = f" (and {len(changed) - 1} more file(s))" if len(changed) > 1 else ""
    raise UserError(f"DATA={data}: source file {path} {what} since run {run.name} held its validation rows out of "
                    f"it{more}: the rows at its start are other text now. Restore the file, or score the run's "
                    f"validation blocks ({run / VAL_BLOCKS}, the default DATA)")


def streamed_from(folder: Path | None, data: str) -> bool:
    """Whether `data` is the mix config of the streaming run in `folder` (its run_config.json's mix): its held-out
    rows are then what the run never trained on."""
    from sparknet.common.runtime import project_path
    from sparknet.config.mix import load_config

    if folder is None or data_kind(data) != "config":
        return False
    for run in (folder, folder.parent):
        identity = run / RUN_CONFIG
        if identity.is_file() and (run / VAL_REPORT).is_file():
            try:
                recorded = json.loads(identity.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                return False
            return isinstance(recorded, dict) and recorded.get("mix") == load_config(
                str(project_path(data))).to_dict()["mix"]
    return False


def _held_out_rows(config: Any, request: DataRequest) -> tuple[dict[str, int], dict[str, dict[int, int]],
                                                               Path | None]:
    """Rows per source from the start; among them, per source, the documents the hold-out took only the start of
    (row -> the tokens it took; their rest was trained on); and the run whose tokenizer counted those tokens:
    `holdout_rows` for every source (nothing cut, no run), else the fewest rows any streaming run among the models
    held out, and of each cut document the fewest tokens any of them held out (so no model scores text it was
    trained on)."""
    labels = [s.label for s in config.mix]
    if request.holdout_rows > 0:
        return {label: request.holdout_rows for label in labels}, {label: {} for label in labels}, None
    mix = config.to_dict()["mix"]
    recorded, tokenizer_run = [], None
    for folder in request.runs:
        for run in (folder, folder.parent):
            identity, report = run / RUN_CONFIG, run / VAL_REPORT
            if identity.is_file() and report.is_file():
                fix = "restore it from a backup of the run, or set HOLDOUT_ROWS"
                recorded_identity = read_json_object(identity, fix)
                if recorded_identity.get("mix") == mix:
                    _check_files_unchanged(recorded_identity, config, run, request.data)
                    try:
                        recorded.append(read_val_report(report)["held_out"])
                        tokenizer_run = tokenizer_run or run
                    except ValueError as exc:
                        raise UserError(f"{report} is damaged ({exc}): {fix}") from None
                break
    if not recorded:
        raise UserError(
            f"DATA={request.data}: no model among MODELS was trained on this config by train_sparknet.py, so which "
            "rows were held out is not known: set HOLDOUT_ROWS to the rows per source to score from each source's "
            "start (documents a model may have trained on if it saw this config), or pass the run's packed dataset "
            "folder as DATA"
        )
    rows = {label: min(int(r.get(label, {}).get("rows", 0)) for r in recorded) for label in labels}
    cut: dict[str, dict[int, int]] = {label: {} for label in labels}
    for r in recorded:
        for label in labels:
            for row, token in dict(r.get(label, {}).get("rests", {})).items():
                cut[label][int(row)] = min(int(token), cut[label].get(int(row), int(token)))
    return rows, cut, tokenizer_run


def _start_of(run: Path | None) -> Any:
    """`start(text, n)`: the text of `text`'s first n tokens with the tokenizer of `run` (what its hold-out took of
    a document it cut)."""
    from sparknet.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(run))

    def start(text: str, n: int) -> str:
        # verbose=False: a document longer than the model's context is expected here (the hold-out cut it) and must
        # not log transformers' "longer than the maximum sequence length" warning
        return tokenizer.decode(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"][:n])

    return start
