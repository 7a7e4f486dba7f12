"""The streaming trainer's data: the mix's sources streamed, encoded in parallel, mixed by tokens and packed into
fixed blocks on the fly, with an exact position that a checkpoint saves and a resumed run restores.

Per rank, every source goes reader -> encoder -> mixer -> packer:
- `SourceReader` (data/reader.py): the held-out validation rows skipped, this rank's whole shards (or, where the
  shards do not divide among the ranks, every `world_size`-th row), optionally a seeded shuffle buffer, optionally
  restarted when dry;
- `EncodedDocuments` (data/prefetch.py): bounded batches encoded ahead on `num_workers` spawned processes (or in
  this process), as the packed build does;
- `Mixer` with token cost (data/mixing.py): the next document from the source furthest behind its token share, so
  the blocks carry the mix from the first one on;
- `BlockPacker` (data/packing.py): documents end with eos, are concatenated and cut into `block_size` blocks;
  nothing is padded.
The blocks depend only on the inputs and the saved position, never on `num_workers`.

The position is the one thing written by hand here, because no library gives it for this pipeline: `datasets`
saves a plain stream's position but not a shuffle buffer's, nor which encoded documents a mixer has used, nor a
packer's partial block. It holds no tokens: per source the reader's position before the batch holding the first
unused document plus how many of that batch's documents to skip, the mixer's counts, and the document being cut
("source X, from token k"), which is read again on restore. Read-ahead documents (the mixer's heads, the batches in
flight) are simply read again. Its size is bounded by the shuffle buffers' texts.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import logging
import math
import sys
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Literal

import numpy as np
import torch

from sparknet.config import MixConfig, describe_changes
from sparknet.data.encoder_pool import EncoderPool
from sparknet.data.mixing import Mixer
from sparknet.data.packing import (
    BlockPacker,
    DocumentEncoder,
    cut_document,
    token_dtype,
    val_document_caps,
)
from sparknet.data.prefetch import Done, EncodedDocuments
from sparknet.data.reader import SourceReader
from sparknet.errors import UserError

log = logging.getLogger(__name__)

OnExhausted = Literal["stop", "renormalise", "restart"]
ON_EXHAUSTED: tuple[str, ...] = ("stop", "renormalise", "restart")
STATE_FORMAT = 1


class TokenStream(torch.utils.data.IterableDataset):
    """Iterate for `{"input_ids": LongTensor[block_size], "labels": the same tensor}` blocks of the mix.

    When a source runs dry (`on_exhausted`):
    - "renormalise" (default): a warning names it once; the others go on, each keeping its relative share; the
      stream ends when every source is dry.
    - "stop": a warning names it and the stream ends there (iteration stops, no exception; blocks already given
      stand), so that a trainer ends its run cleanly, with its checkpoint, rather than train on a mix that no
      longer holds or crash after hours; `stats()["end"]` says why.
    - "restart": it is read again from its start (after the held-out rows); `stats()["restarts"]` counts that.
    In every mode a stream that cannot give even one block raises UserError.

    `skip_documents[label]` rows at the start of a source are never read for training (the validation hold-out;
    see `hold_out_validation`). Rank `rank` of `world_size` keeps every `world_size`-th of the remaining rows, so
    ranks train on disjoint documents and each rank's stream carries the mix.

    `state_dict()` after any block is the exact position (plain data: JSON- and `torch.save`-able, loadable with
    `weights_only=True`); `load_state_dict` on a fresh stream with the same settings, before iterating, continues
    with exactly the blocks an uninterrupted stream would have given next. Calling `iter()` again continues from
    where the previous iterator stopped (one iterator at a time). Iterate in the main process only
    (DataLoader(num_workers=0)): the stream runs its own `num_workers` encoding processes.
    """

    def __init__(
        self,
        *,
        config: MixConfig,
        tokenizer_json: str,
        eos_id: int,
        block_size: int,
        seed: int,
        shuffle_buffer: int = 0,
        on_exhausted: OnExhausted = "renormalise",
        num_workers: int = 0,
        rank: int = 0,
        world_size: int = 1,
        skip_documents: dict[str, int] | None = None,
        batch_docs: int = 256,
        batch_chars: int = 1 << 20,
        document_caps: dict[str, int] | None = None,
    ) -> None:
        from tokenizers import Tokenizer

        super().__init__()
        labels = [spec.label for spec in config.mix]
        skip_documents = dict(skip_documents or {})
        problems = []  # every mistake at once
        if on_exhausted not in ON_EXHAUSTED:
            problems.append(f"ON_EXHAUSTED={on_exhausted!r}: expected one of {', '.join(ON_EXHAUSTED)}")
        if block_size < 2:
            problems.append(f"BLOCK_SIZE={block_size}: expected 2 or more tokens (a block of one token has no next "
                            "token to predict)")
        if shuffle_buffer < 0:
            problems.append(f"SHUFFLE_BUFFER={shuffle_buffer}: expected 0 (no shuffling) or a number of documents")
        if num_workers < 0:
            problems.append(f"num_workers={num_workers}: expected 0 (encode in this process) or more")
        if not 0 <= rank < world_size:
            problems.append(f"rank {rank} of world size {world_size}: expected 0 <= rank < world size")
        unknown = sorted(set(skip_documents) - set(labels))
        if unknown:
            problems.append(f"skip_documents names no source of the mix: {', '.join(unknown)} (sources: "
                            f"{', '.join(labels)})")
        if any(not isinstance(n, int) or n < 0 for n in skip_documents.values()):
            problems.append(f"skip_documents: expected counts >= 0, got {skip_documents}")
        if problems:
            raise UserError("; ".join(problems))
        vocab_size = Tokenizer.from_str(tokenizer_json).get_vocab_size()
        if not 0 <= eos_id < vocab_size:
            raise UserError(f"eos id {eos_id} is outside the tokenizer's vocabulary of {vocab_size}")
        self.config = config
        self.tokenizer_json = tokenizer_json
        self.eos_id = eos_id
        self.block_size = block_size
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.on_exhausted = on_exhausted
        self.num_workers = num_workers
        self.rank, self.world_size = rank, world_size
        self.skip_documents = {label: skip_documents.get(label, 0) for label in labels}
        self.batch_docs, self.batch_chars = batch_docs, batch_chars
        self.dtype = token_dtype(vocab_size)
        # a validation hold-out cuts documents longer than its source's cap (packing.val_document_caps)
        self.document_caps = dict(document_caps) if document_caps else None
        self.settings = _plain(
            {
                "sources": config.to_dict()["mix"],
                "block_size": block_size,
                "seed": seed,
                "shuffle_buffer": shuffle_buffer,
                "rank": rank,
                "world_size": world_size,
                "skip_documents": self.skip_documents,
                "tokenizer_sha256": hashlib.sha256(tokenizer_json.encode()).hexdigest(),
                "eos_id": eos_id,
                **({"document_caps": self.document_caps} if self.document_caps else {}),
            }
        )
        self._state: dict[str, Any] | None = None  # loaded, not yet iterated
        self._pipeline: _Pipeline | None = None
        self._pool: Any = None
        self._encoder: DocumentEncoder | None = None
        self._busy_seconds = 0.0
        self._timed_tokens = 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if torch.utils.data.get_worker_info() is not None:
            raise UserError(
                "TokenStream cannot run in DataLoader worker processes (its position lives in the main process and "
                "it runs its own encoders): use DataLoader(num_workers=0) and the stream's num_workers"
            )
        pipeline = self._start()
        started = time.perf_counter()
        for block in pipeline.blocks():
            ids = torch.from_numpy(block.astype(np.int64))
            # only the time spent producing counts: the consumer's time between blocks is its own
            self._busy_seconds += time.perf_counter() - started
            self._timed_tokens += self.block_size
            yield {"input_ids": ids, "labels": ids}
            started = time.perf_counter()

    def state_dict(self) -> dict[str, Any]:
        """The exact position after the blocks given so far (a copy; includes "blocks_yielded")."""
        if self._pipeline is not None:
            return self._pipeline.state_dict()
        if self._state is not None:
            return copy.deepcopy(self._state)
        return self._initial_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from `state` at the next iteration; refuses a state saved with other settings."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise UserError(f"not a TokenStream state of format {STATE_FORMAT}: cannot resume the stream from it")
        saved = state.get("settings", {})
        if _plain(saved) != self.settings:
            changes = "; ".join(describe_changes(_plain(saved), self.settings))
            raise UserError(f"the saved stream position was taken with other data settings ({changes}): it cannot "
                            "be resumed with these; start a new run")
        self._state = copy.deepcopy(state)
        self._pipeline = None

    def stats(self) -> dict[str, Any]:
        """Realised token shares and tokens per source of the blocks given so far (since the start of the stream,
        across resumes), the production rate in tokens/s (time spent producing blocks in this process, the
        consumer's time excluded), blocks, documents and restarts per source, dry sources, and why it ended."""
        if self._pipeline is not None:
            p = self._pipeline
            tokens = {label: int(p.packer.tokens_by_source[label]) for label in p.sources}
            documents = {label: c.documents for label, c in p.mixer.counts.items()}
            restarts = p.restarts()
            exhausted = [label for label, c in p.mixer.counts.items() if c.exhausted]
            blocks, end = p.blocks_yielded, p.end
        else:
            state = self.state_dict()
            tokens = dict(state["packer"]["tokens"])
            documents = {label: c["documents"] for label, c in state["mixer"].items()}
            restarts = dict(state["restarts"])
            exhausted = [label for label, c in state["mixer"].items() if c["exhausted"]]
            blocks, end = state["blocks_yielded"], state["end"]
        total = sum(tokens.values())
        return {
            "shares": {label: (n / total if total else 0.0) for label, n in tokens.items()},
            "tokens": tokens,
            "tokens_per_second": self._timed_tokens / self._busy_seconds if self._busy_seconds else 0.0,
            "busy_seconds": self._busy_seconds,  # time this process spent waiting inside the stream
            "timed_tokens": self._timed_tokens,
            "blocks": blocks,
            "documents": documents,
            "restarts": restarts,
            "exhausted": exhausted,
            "end": end,
        }

    def close(self) -> None:
        """Terminates the encoding processes; the position stays readable."""
        if self._pool is not None:
            self._pool_finalizer.detach()
            self._pool.terminate()
            self._pool = None

    def _start(self) -> _Pipeline:
        state = self.state_dict()
        self._state = None
        self._pipeline = _Pipeline(self, state, self._submitter())
        return self._pipeline

    def _submitter(self) -> Callable[[list[str]], Any]:
        if self.num_workers == 0:
            if self._encoder is None:
                self._encoder = DocumentEncoder(self.tokenizer_json, self.eos_id, self.dtype)
            encoder = self._encoder
            return lambda texts: Done(encoder(texts))
        if self._pool is None:
            self._pool = EncoderPool(self.num_workers, self.tokenizer_json, self.eos_id, self.dtype)
            self._pool_finalizer = weakref.finalize(self, self._pool.terminate)
        return self._pool.submit

    def _initial_state(self) -> dict[str, Any]:
        labels = list(self.skip_documents)
        return {
            "format": STATE_FORMAT,
            "settings": copy.deepcopy(self.settings),
            "blocks_yielded": 0,
            "end": None,
            "sources": {label: {"reader": None, "skip": 0} for label in labels},
            "mixer": {label: {"documents": 0, "units": 0, "exhausted": False} for label in labels},
            "packer": {"tokens": {label: 0 for label in labels}, "documents": {label: 0 for label in labels}},
            "current": None,
            "warned": [],
            "restarts": {label: 0 for label in labels},
        }


class _Pipeline:
    """One live run of the stream from a position: readers -> encoders -> mixer -> packer."""

    def __init__(self, stream: TokenStream, state: dict[str, Any], submit: Callable[[list[str]], Any]) -> None:
        self.settings = stream.settings
        self.block_size = stream.block_size
        self.on_exhausted = stream.on_exhausted
        self.sources: dict[str, EncodedDocuments] = {}
        for spec in stream.config.mix:
            position = state["sources"][spec.label]
            reader = SourceReader(
                spec,
                skip=stream.skip_documents[spec.label],
                rank=stream.rank,
                world_size=stream.world_size,
                restart=stream.on_exhausted == "restart",
                shuffle_buffer=stream.shuffle_buffer,
                seed=stream.seed,
                state=position["reader"],
            )
            self.sources[spec.label] = EncodedDocuments(
                reader,
                submit,
                in_flight=max(2, 2 * stream.num_workers),
                max_docs=stream.batch_docs,
                max_chars=stream.batch_chars,
                skip=position["skip"],
            )
        self.caps = stream.document_caps
        costs = {label: (lambda d, c=cap: min(len(d), c)) for label, cap in (self.caps or {}).items()}
        self.mixer: Mixer[np.ndarray] = Mixer(self.sources, {s.label: s.prob for s in stream.config.mix}, cost=len,
                                              costs=costs)
        self.documents_cut: Counter[str] = Counter()
        self.mixer.load_state_dict(state["mixer"])
        self.packer = BlockPacker(self.block_size, stream.dtype, flush_tokens=sys.maxsize)
        self.blocks_yielded = int(state["blocks_yielded"])
        self.end: str | None = state["end"]
        self.warned = set(state["warned"])
        self._restarts = dict(state["restarts"])  # at the position, before any document of this run
        # The document being cut: [label, its length, its tokens in blocks given so far (negative while tokens of
        # earlier documents still fill the block it starts in)]. At every block given, it alone is pending.
        self._current: list[Any] | None = None
        current = state["current"]
        if current is not None and self.end is None:
            doc = next(self.sources[current["label"]], None)
            doc = self._cut(current["label"], doc) if doc is not None else None
            if doc is None or current["offset"] >= len(doc):
                raise UserError(f"source {current['label']!r} no longer holds the document the saved stream position "
                                "was cutting: its data changed since the checkpoint; start a new run")
            self.packer.add(current["label"], doc[current["offset"]:])
            self._current = [current["label"], len(doc), current["offset"]]
        self.packer.tokens_by_source = Counter(state["packer"]["tokens"])
        self.packer.documents_by_source = Counter(state["packer"]["documents"])
        self.packer.blocks = self.blocks_yielded
        self._mixed = iter(self.mixer)

    def blocks(self) -> Iterator[np.ndarray]:
        """The blocks from the position on, one at a time (so that every block given has an exact position)."""
        size = self.block_size
        while self.end is None:
            while self.packer.pending_tokens < size:
                item = next(self._mixed, None)
                dry = self._note_dry()
                if item is None:
                    self._finish("every source ran dry")
                    return
                if dry and self.on_exhausted == "stop":
                    self._finish(f"source {dry[0]!r} ran dry (ON_EXHAUSTED=stop)")
                    return
                label, doc = item
                doc = self._cut(label, doc)
                self._current = [label, len(doc), -self.packer.pending_tokens]
                self.packer.add(label, doc)
            block = self.packer.take(1)[0]
            assert self._current is not None
            self._current[2] += size
            self.blocks_yielded += 1
            yield block

    def _cut(self, label: str, doc: np.ndarray) -> np.ndarray:
        if self.caps is None or len(doc) <= self.caps[label]:
            return doc
        self.documents_cut[label] += 1
        return cut_document(doc, self.caps[label])

    def state_dict(self) -> dict[str, Any]:
        current = self._current
        cutting = current is not None and current[2] < current[1]
        sources = {}
        for label, source in self.sources.items():
            # documents handed out but not used are read again: the mixer's read-ahead and the one being cut
            unused = int(self.mixer.has_read_ahead(label)) + int(cutting and current[0] == label)
            # a copy: the live batch records hold these dicts
            sources[label] = copy.deepcopy(source.position(source.handed_out - unused))
        return {
            "format": STATE_FORMAT,
            "settings": copy.deepcopy(self.settings),
            "blocks_yielded": self.blocks_yielded,
            "end": self.end,
            "sources": sources,
            "mixer": self.mixer.state_dict(),
            "packer": {
                "tokens": {label: int(self.packer.tokens_by_source[label]) for label in self.sources},
                "documents": {label: int(self.packer.documents_by_source[label]) for label in self.sources},
            },
            "current": {"label": current[0], "offset": int(current[2])} if cutting else None,
            "warned": sorted(self.warned),
            "restarts": self.restarts(),
        }

    def _last_used(self, label: str) -> tuple[int, int] | None:
        """(passes, rows read) of the source's last document used (the one being cut included), None if none yet."""
        source = self.sources[label]
        return source.mark(source.handed_out - int(self.mixer.has_read_ahead(label)))

    def restarts(self) -> dict[str, int]:
        """Per source, the restarts before its last document used (read-ahead restarts not counted)."""
        return {label: (mark[0] if (mark := self._last_used(label)) else self._restarts[label])
                for label in self.sources}

    def rows_used(self) -> dict[str, int]:
        """Per source, rows to skip so that no document used so far (the one being cut included) is read again."""
        return {label: (mark[1] if (mark := self._last_used(label)) else 0) for label in self.sources}

    def _note_dry(self) -> list[str]:
        """Every source found dry so far (a warning for each, the first time)."""
        dry = [label for label, c in self.mixer.counts.items() if c.exhausted]
        for label in dry:
            if label not in self.warned:
                self.warned.add(label)
                then = ("the stream stops here" if self.on_exhausted == "stop"
                        else "the other sources go on in proportion")
                log.warning("source %r ran dry after %d documents: %s (ON_EXHAUSTED=%s)", label,
                            self.mixer.counts[label].documents, then, self.on_exhausted)
        return dry

    def _finish(self, reason: str) -> None:
        if self.blocks_yielded == 0:
            settings = self.settings
            skipped = settings["skip_documents"]
            counts = ", ".join(f"{label}: {c.documents} documents" + (
                f" after {skipped[label]} rows held out for validation" if skipped.get(label) else "")
                for label, c in self.mixer.counts.items())
            rank = f" for rank {settings['rank']} of {settings['world_size']}" if settings["world_size"] > 1 else ""
            # the hold-out's rows include the documents still in the shuffle buffer: a whole small source
            buffer = (f"lower SHUFFLE_BUFFER (the hold-out also skips the up to {settings['shuffle_buffer']:,} "
                      "documents in each source's shuffle buffer) below the sources' row counts, "
                      if any(skipped.values()) and settings["shuffle_buffer"] else "")
            raise UserError(
                f"{reason} before one block of {self.block_size} tokens could be made{rank} ({counts}): "
                f"{buffer}add data, or lower BLOCK_SIZE or VAL_TOKENS"
            )
        log.warning("the stream ended after %d blocks: %s", self.blocks_yielded, reason)
        self.end = reason
        self._current = None
        self.packer.finish()  # the partial rest is dropped, as in the packed build


def hold_out_validation(
    *,
    config: MixConfig,
    tokenizer_json: str,
    eos_id: int,
    block_size: int,
    val_tokens: int,
    seed: int,
    shuffle_buffer: int = 0,
    num_workers: int = 0,
) -> tuple[np.ndarray, dict[str, int], dict[str, Any]]:
    """The validation blocks ([n_blocks, block_size], uint16/uint32; at least `val_tokens` tokens in whole blocks),
    taken from the start of the mixed stream, unsharded (the same on every rank); the rows of each source they used
    (pass as `skip_documents` to TokenStream so that training never reads them); and a report of their shares.
    Documents longer than their source's cap (`packing.val_document_caps`) are cut, so that the blocks carry the
    mix within ±2 points; the rest of a cut document is never trained on either.

    With a shuffle buffer the rows skipped also hold the documents still in the buffer: at most `shuffle_buffer`
    documents per source are then neither validated nor trained on.
    """
    if val_tokens <= 0:
        raise UserError(f"VAL_TOKENS={val_tokens}: expected a positive number (the trainer evaluates on them)")
    wanted = math.ceil(val_tokens / block_size)
    caps = val_document_caps({s.label: s.prob for s in config.mix}, val_tokens)
    stream = TokenStream(config=config, tokenizer_json=tokenizer_json, eos_id=eos_id, block_size=block_size,
                         seed=seed, shuffle_buffer=shuffle_buffer, num_workers=num_workers, document_caps=caps)
    try:
        pipeline = stream._start()
        blocks = list(itertools.islice(pipeline.blocks(), wanted))
        rows = pipeline.rows_used()
        stats = stream.stats()
        cut = dict(pipeline.documents_cut)
        # a source read to its end while holding out (small, or a shuffle buffer larger than it): its size is known
        sizes = {label: source.reader.rows if source.reader.draining or source.reader.passes else None
                 for label, source in pipeline.sources.items()}
    finally:
        stream.close()
    if len(blocks) < wanted:
        log.warning("the sources hold only %d of the %d validation blocks asked: nothing is left to train on",
                    len(blocks), wanted)
    requested = {s.label: s.prob for s in config.mix}
    report = {
        "blocks": len(blocks),
        "tokens": len(blocks) * block_size,
        "requested_tokens": val_tokens,
        "sources": {
            label: {
                "tokens": stats["tokens"][label],
                "documents": stats["documents"][label],
                "share": stats["shares"][label],
                "requested_share": requested[label],
                "rows_held_out": rows[label],
                "rows_in_source": sizes[label],  # None: not read to its end
                "exhausted": label in stats["exhausted"],
                "document_cap_tokens": caps[label],
                "documents_cut": cut.get(label, 0),
            }
            for label in requested
        },
    }
    return np.stack(blocks), rows, report


def _plain(data: Any) -> Any:
    """`data` as JSON would give it back (tuples as lists), so that saved and current settings compare equal."""
    return json.loads(json.dumps(data))
