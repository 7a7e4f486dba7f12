"""One mix entry opened as a lazy stream of document texts: a Hub dataset id, or local data files of one of the
kinds in sparknet.config.kinds.LOCAL_KINDS (json, parquet, csv, text), each read by the datasets builder of that name.

Always `streaming=True`: a source is read row by row and never materialised, whatever its size. A Hub source may be
pinned to a `revision` (branch, tag or commit); `resolve_revisions` finds the commit each Hub source reads now.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from sparknet.common.errors import UserError, exception_chain
from sparknet.config.mix import MixConfig, SourceSpec, expand_pattern

log = logging.getLogger(__name__)

# Seconds to wait for the Hub when resolving a revision: the answer is a manifest's footnote, not worth a stall.
HUB_TIMEOUT_S = 10.0

# Tried in order when a source names no text_field.
TEXT_FIELD_CANDIDATES = ("text", "content", "document", "body", "raw_content")
# A pre-tokenized source: rows with this column of token ids and none of the text columns above.
TOKENS_FIELD = "input_ids"


def open_source(spec: SourceSpec) -> Any:
    """The source as a streaming `datasets.IterableDataset` (rows as dicts)."""
    from datasets import load_dataset

    from sparknet.common.progress import share_one_tqdm_lock

    share_one_tqdm_lock()  # datasets opens it with a thread_map, often on a read-ahead thread

    if spec.revision is not None and _reads_no_revision(spec):
        # datasets would ignore the pin without a word and read whatever the folder holds now
        kind = "a local folder" if os.path.isdir(spec.name) else "a datasets builder"
        raise UserError(
            f"source {spec.label!r}: revision {spec.revision!r} pins a Hub dataset, but {spec.name!r} is {kind}, "
            'read as it is now whatever the revision: remove "revision"'
        )
    files = spec.resolved_data_files()
    if isinstance(files, list):
        files = {spec.split: files}  # a plain list of files is the split the entry names
    builder_kwargs = dict(spec.local.builder_kwargs) if spec.local else {}
    try:
        return load_dataset(
            spec.name, spec.subset, split=spec.split, data_files=files, revision=spec.revision, streaming=True,
            **builder_kwargs,
        )
    except Exception as exc:  # any failure to open is reported against the user's mix entry
        access = hub_access_error(spec, exc)
        if access is not None:
            raise access from None
        named = spec.data_file_patterns()
        empty = [f for f in named if os.path.isfile(f) and os.path.getsize(f) == 0]
        if empty and len(empty) == len(named):  # datasets fails with a bare StopIteration
            raise UserError(f"source {spec.label!r}: its data file {empty[0]} is empty (0 bytes): fill it, or remove "
                            "the entry from the mix") from None
        hint = ""
        if not spec.local:
            hint = (
                " (Hub sources need network access or a local cache: with HF_HUB_OFFLINE=1 only cached datasets "
                "open; gated datasets need `hf auth login`)"
            )
        raise UnreadableSource(
            f"cannot open source {spec.label!r} ({spec.name}, split {spec.split!r}): {type(exc).__name__}: {exc}{hint}",
            exc) from None


def hub_access_error(spec: SourceSpec, exc: BaseException) -> UserError | None:
    """The one line for a Hub dataset this machine may not read (gated, missing, an unknown revision), from
    huggingface_hub's typed errors or datasets' DatasetNotFoundError (whose cause is one of them, or whose words say
    which); None for any other failure."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    chain = exception_chain(exc)
    names = {type(e).__name__ for e in chain}
    words = " ".join(str(e) for e in chain)
    where = f"source {spec.label!r}: the Hub dataset {spec.name!r}"
    if any(isinstance(e, GatedRepoError) for e in chain) or ("DatasetNotFoundError" in names and "gated" in words):
        return UserError(f"{where} is gated: log in with `hf auth login` (or set HF_TOKEN) as an account that has "
                         f"accepted its terms on its Hub page, datasets/{spec.name}")
    if any(isinstance(e, RevisionNotFoundError) for e in chain):
        return UserError(f"{where} has no revision {spec.revision!r}: check the mix entry's \"revision\" (a branch, "
                         "tag or full commit id)")
    if any(isinstance(e, RepositoryNotFoundError) for e in chain) or "DatasetNotFoundError" in names:
        return UserError(f"{where} does not exist on the Hub (or is private): check the id's spelling in the mix "
                         "config, or log in with `hf auth login` (or set HF_TOKEN) if it is private")
    return None


def _reads_no_revision(spec: SourceSpec) -> bool:
    """Whether datasets reads the entry without looking at a revision: local files of a kind SparkNet reads, or a
    local folder (taken before the Hub, as datasets does)."""
    return spec.local is not None or os.path.isdir(spec.name)


def is_hub_source(spec: SourceSpec) -> bool:
    """Whether the source is read from the Hub (over the network), not from local files."""
    return not _reads_no_revision(spec)


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (read by huggingface_hub at import) or either offline variable set now: datasets reads only
    its cache then, so a commit asked of the Hub would not name the data read."""
    from huggingface_hub import constants

    now = (os.environ.get(v, "").strip().upper() for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    return constants.is_offline_mode() or any(v in {"1", "ON", "YES", "TRUE"} for v in now)


def resolve_revisions(config: MixConfig) -> dict[str, str | None]:
    """The commit sha each Hub source of the mix reads, by label: its `revision` (or the default branch) as the Hub
    resolves it now. None for local sources, offline, and on any failure (no network, unknown dataset or revision,
    gated): the pin then stays the revision as written. Waits at most HUB_TIMEOUT_S per dataset, and once the Hub
    cannot be reached asks no more. Raises only the one-line error of a dataset that cannot be read at all (gated,
    missing, an unknown revision), before any work."""
    out: dict[str, str | None] = {spec.label: None for spec in config.mix}
    hub = [spec for spec in config.mix if not _reads_no_revision(spec)]
    if not hub or hub_offline():
        return out
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    asked: dict[tuple[str, str | None], str | None] = {}  # another split or subset of the same revision: one call
    for spec in hub:
        key = (spec.name, spec.revision)
        if key not in asked:
            try:
                asked[key] = api.dataset_info(spec.name, revision=spec.revision, timeout=HUB_TIMEOUT_S).sha
            except Exception as exc:  # a missing footnote must not stop a build
                access = hub_access_error(spec, exc)
                if access is not None:
                    raise access from None
                reason = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                if not isinstance(exc, HfHubHTTPError):  # no answer at all: the next dataset would wait as long
                    log.warning("cannot reach the Hub to resolve the sources' revisions (%s); the manifest records "
                                "none", reason)
                    return out  # the sources not reached yet stay None
                log.warning("source %r: the Hub resolves no revision (%s); the manifest records none", spec.label,
                            reason)
                asked[key] = None
        out[spec.label] = asked[key]
    return out


def at_commits(config: MixConfig, commits: dict[str, str | None]) -> MixConfig:
    """The mix with each source that has a resolved commit read at that commit, so that a long read (and its resume)
    sees one snapshot even if a branch moves meanwhile; labels, and so seeds and reports, unchanged."""
    return dataclasses.replace(config, mix=tuple(
        dataclasses.replace(s, revision=commits[s.label]) if commits.get(s.label) else s for s in config.mix))


def declared_columns(rows: Any) -> dict[str, str] | None:
    """The stream's declared columns and their types (`string`, `int64`, ...) from its features, or None when the
    stream declares none (then the first row's column names stand in)."""
    features = getattr(rows, "features", None)
    if not features:
        return None
    return {name: str(getattr(feature, "dtype", type(feature).__name__)) for name, feature in features.items()}


# Arrow type names shown as the Python types users see in their JSON.
_SHOWN_TYPES = {"string": "str", "large_string": "str", "int64": "int", "int32": "int", "float64": "float",
                "double": "float", "bool": "bool", "null": "null", "Json": "mixed JSON"}


def pick_text_field(row: dict[str, Any], spec: SourceSpec, columns: dict[str, str] | None = None) -> str:
    """The column holding the document text: the entry's text_field, else the first common name among the declared
    `columns` (from the stream's features), else the only string column. Decided from the columns, not from one
    row's values, so a first row whose text is null does not send the whole source to another column."""
    if columns is None:  # no declared features: the row's keys are the columns, its values hint at their types
        columns = {k: "string" if isinstance(v, str) else ("null" if v is None else type(v).__name__)
                   for k, v in row.items()}
    shown = ", ".join(f"{k} ({_SHOWN_TYPES.get(t, t)})" for k, t in columns.items()) or "none"
    if spec.text_field is not None:
        if spec.text_field not in columns:
            raise UserError(
                f"source {spec.label!r}: text_field {spec.text_field!r} is not a column; columns found: {shown}"
            )
        return spec.text_field
    textual = {"string", "large_string", "null"}
    for name in TEXT_FIELD_CANDIDATES:
        if columns.get(name) in textual:
            return name
    mixed = [name for name in TEXT_FIELD_CANDIDATES if name in columns]
    if mixed:  # e.g. {"text": 42} among the rows: the column is there, but not all text
        raise UserError(
            f"source {spec.label!r}: column {mixed[0]!r} holds {_SHOWN_TYPES.get(columns[mixed[0]], columns[mixed[0]])}"
            f" values, not only text (columns found: {shown}): every row's {mixed[0]!r} must be a JSON string; fix "
            'those rows, or set "text_field" to another column'
        )
    strings = [k for k, t in columns.items() if t in ("string", "large_string")]
    if len(strings) == 1:
        return strings[0]
    raise UserError(
        f"source {spec.label!r}: no usable text column (looked for {', '.join(TEXT_FIELD_CANDIDATES)}); "
        f'columns found: {shown}. Set "text_field" in its mix entry to the column holding the text'
    )


def column_read(row: dict[str, Any], spec: SourceSpec, columns: dict[str, str] | None) -> str:
    """The column a source's documents are read from, decided at its first `row` (with the stream's declared
    `columns`): `input_ids` for a pre-tokenized source, else `pick_text_field`'s."""
    if spec.text_field is None and _pre_tokenized(row, columns):
        return TOKENS_FIELD
    return pick_text_field(row, spec, columns)


# The column each source was read from in this process (by `_read_key`), as its readers decided it: what a summary
# says was read, without opening the source again.
_COLUMNS_READ: dict[str, str] = {}


def _read_key(spec: SourceSpec) -> str:
    """What makes two specs the same reading (the label alone does not: two configs may share one)."""
    return json.dumps([spec.name, spec.data_files, spec.split, spec.subset, spec.text_field, spec.label],
                      sort_keys=True)


def text_column(spec: SourceSpec) -> str | None:
    """The column a source is read from, as its reader decides it (`column_read` on its first row), for the summaries
    and records that say what was read: the column this process's reader took, else the source opened for its first
    row; None when it cannot be opened now (a Hub source offline: a record is not worth a failed build) or holds no
    row."""
    if _read_key(spec) in _COLUMNS_READ:
        return _COLUMNS_READ[_read_key(spec)]
    try:
        rows = open_source(spec)
        row = next(iter(read_rows(rows, spec)), None)
        return None if row is None else column_read(row, spec, declared_columns(rows))
    except UserError:
        return None


class RowDocuments:
    """The document of each row of one pass over a source: its text, from the text column picked at the first row
    (from the stream's declared columns, `pick_text_field`; a non-text value is the user's mistake), or, for a
    pre-tokenized source (rows with an `input_ids` column and no text column, recognised without a key), its list of
    token ids, each checked against the `vocab_size` of the tokenizer that will read them (None: text is needed,
    as it is to train a tokenizer). Rows without a document (missing, null or empty) are skipped with one warning
    per pass."""

    def __init__(self, spec: SourceSpec, vocab_size: int | Callable[[], int] | None = None) -> None:
        self.spec, self.vocab_size, self.field, self.warned = spec, vocab_size, None, False
        self.tokens = False  # a pre-tokenized source (decided at the first row)
        # the first row of each kind seen (text, token ids): a source of both kinds is refused (`_one_kind`)
        self.first_of_kind: dict[str, int] = {}

    def document(self, row: dict[str, Any], row_index: int, rows: Any) -> str | list[int] | None:
        """The document of `row` (the `row_index`-th of the pass, read from the opened stream `rows`), None when it
        has none."""
        if self.field is None:
            self.field = _COLUMNS_READ[_read_key(self.spec)] = column_read(row, self.spec, declared_columns(rows))
            if self.field == TOKENS_FIELD and self.spec.text_field is None:
                if self.vocab_size is None:
                    raise UserError(f"source {self.spec.label!r} holds token ids ({TOKENS_FIELD!r}), not text: "
                                    "a tokenizer trains on text; leave this source out of its mix config")
                self.tokens = True
                if callable(self.vocab_size):  # known only now that it is needed (a tokenizer to load)
                    self.vocab_size = self.vocab_size()
        if self.tokens:
            if row.get(self.spec.text_field or "text"):  # a text beside the ids (no text column declared)
                self._one_kind("text", row_index)
            return self._ids(row.get(TOKENS_FIELD), row_index)
        text = row.get(self.field)
        if text is not None and not isinstance(text, str):
            raise UserError(
                f"source {self.spec.label!r}: column {self.field!r} holds {type(text).__name__}, not text; "
                'set "text_field" to a text column'
            )
        if text:
            self._one_kind("text", row_index)
            return text
        if self.spec.text_field is None and isinstance(row.get(TOKENS_FIELD), list) and row[TOKENS_FIELD]:
            self._one_kind("token ids", row_index)  # a row of ids among text rows: not a row without a document
            return None
        self._warn_empty(row_index, "text")
        return None

    def _one_kind(self, kind: str, row_index: int) -> None:
        """Records the first row of `kind`; refuses the source once it holds rows of both kinds (half of them would
        be skipped as rows without a document, or trained as text of another meaning)."""
        self.first_of_kind.setdefault(kind, row_index)
        if len(self.first_of_kind) > 1:
            text_row, ids_row = self.first_of_kind["text"], self.first_of_kind["token ids"]
            raise UserError(
                f"source {self.spec.label!r} mixes rows of text and rows of token ids ({TOKENS_FIELD!r}): row "
                f"{text_row} is the first with text, row {ids_row} the first with token ids (rows counted from 0): "
                "a source is one or the other; split its rows into two sources of the mix")

    def _ids(self, ids: Any, row_index: int) -> list[int] | None:
        if not ids:
            self._warn_empty(row_index, "token ids")
            return None
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise UserError(f"source {self.spec.label!r}: row {row_index}'s {TOKENS_FIELD!r} is not a list of "
                            "token ids (integers): fix the rows, or name a text column with \"text_field\"")
        low, high = min(ids), max(ids)
        assert self.vocab_size is not None
        if low < 0 or high >= self.vocab_size:
            bad = high if high >= self.vocab_size else low
            raise UserError(f"source {self.spec.label!r}: row {row_index} holds token id {bad}, outside the "
                            f"tokenizer's {self.vocab_size} ids (0 to {self.vocab_size - 1}): its ids were made with "
                            "another tokenizer; build with that one (TOKENIZER_DIR), or leave the source out")
        return ids

    def _warn_empty(self, row_index: int, what: str) -> None:
        if not self.warned:
            log.warning("source %r: row %d has no %s in column %r (missing, null or empty): such rows are "
                        "skipped; if many rows keep their %s under another key, set \"text_field\"",
                        self.spec.label, row_index, what, self.field, what)
            self.warned = True


def decoded(document: str | list[int], tokenizer: Callable[[], Any] | None) -> str:
    """A document as text: a pre-tokenized one's ids decoded with `tokenizer()` (its trailing eos left out)."""
    if isinstance(document, str):
        return document
    assert tokenizer is not None  # RowDocuments gives ids only where a vocabulary was given
    tokenizer = tokenizer()
    ids = document[:-1] if document and document[-1] == tokenizer.eos_token_id else document
    return tokenizer.decode(ids)


def _pre_tokenized(row: dict[str, Any], columns: dict[str, str] | None) -> bool:
    """Rows of token ids: an `input_ids` column (a list) and none of the text columns."""
    names = columns if columns is not None else row
    return TOKENS_FIELD in names and isinstance(row.get(TOKENS_FIELD), list) and not any(
        name in names for name in TEXT_FIELD_CANDIDATES)


def read_rows(rows: Any, spec: SourceSpec) -> Iterator[dict[str, Any]]:
    """The rows of an opened source; a failure while reading (a malformed JSON line, a vanished file, a network
    error after the retries of `datasets`) becomes one UserError naming the source and the file."""
    it = iter(rows)
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except UserError:
            raise
        except Exception as exc:  # whatever the reader raises, the user needs the source and file
            raise unreadable(spec, rows, exc) from None
        yield row


class UnreadableSource(UserError):
    """A source that failed to open or to be read; `cause` is what the library raised."""

    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause


def unreadable(spec: SourceSpec, rows: Any, exc: BaseException) -> UserError:
    """The error for a source that opened but could not be read, on one line: the source, the file being read when
    it is known, the reader's own words (pyarrow's name the row within the block it parsed), and what to do."""
    where = _file_being_read(rows) or ", ".join(spec.data_file_patterns()) or spec.name
    message = " ".join(str(exc).split()) or type(exc).__name__
    if spec.local and any(isinstance(e, UnicodeDecodeError) for e in exception_chain(exc)):
        # the decoder names a byte's position within the block it was decoding, not where it is in the file
        for path in _local_paths(spec, rows):
            bad = first_bad_utf8_line(path)
            if bad is not None:
                return UnreadableSource(
                    f"cannot read source {spec.label!r} ({path}): line {bad[0]} is not valid UTF-8 ({bad[1]}): "
                    "save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`), or fix or remove the line", exc)
    if spec.local is not None and spec.local.first_bad_row is not None:  # the kind can name the row by its line
        for path in _local_paths(spec, rows):
            bad = spec.local.first_bad_row(path, spec.text_field or "text")
            if bad is not None:
                return UnreadableSource(f"cannot read source {spec.label!r} ({path}): {bad}; fix or remove the line",
                                        exc)
    if spec.local:
        fix = "fix or remove the file"
    else:  # a network failure after the retries of `datasets`: often passing
        fix = ("check the network and run the same command again (an unfinished build resumes from its last saved "
               "position)")
    return UnreadableSource(f"cannot read source {spec.label!r} ({where}): {type(exc).__name__}: {message}; {fix}",
                            exc)


def _local_paths(spec: SourceSpec, rows: Any) -> list[str]:
    """The file being read when it is known, else every file of the source's data_files (patterns expanded)."""
    being_read = _file_being_read(rows)
    return [being_read] if being_read else [str(p) for f in spec.data_file_patterns() for p in expand_pattern(f)]


def first_bad_utf8_line(path: str) -> tuple[int, str] | None:
    """The first line of a text file that is not UTF-8, as (its number from 1, the byte and its column from 1), or
    None (all are, or the file cannot be read: the reader's own message says why). A compressed file (.gz) is read
    decompressed."""
    import gzip

    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as exc:
                    return number, f"byte 0x{line[exc.start]:02x} at column {exc.start + 1}"
    except (OSError, EOFError):
        return None
    return None


def _file_being_read(rows: Any) -> str | None:
    """The file of the shard being read, from the stream's position; best effort, as it reads `datasets` internals."""
    try:
        state = rows.state_dict()
        while "shard_idx" not in state:
            state = state["examples_iterable"]
        ex_iterable = rows._ex_iterable
        while not hasattr(ex_iterable, "kwargs"):
            ex_iterable = ex_iterable.ex_iterable
        files = ex_iterable.kwargs.get("original_files") or ex_iterable.kwargs.get("files")
        return str(files[state["shard_idx"]])
    except Exception:  # no position known: the caller names the source's files instead
        return None
