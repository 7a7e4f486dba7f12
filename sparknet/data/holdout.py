"""The validation hold-out, one rule for the packed build and the streaming trainer: the first blocks of the mixed
stream (data/blocks.py over the validation part, data/spec.py), read in each source's own order by one process, so
they are the same on every rank and for any number of ranks.

A document gives the hold-out at most its source's cap (`DataSpec.document_caps`); the rest of a document it cut
there, or at the end of its last block, is training's: `HeldOut.rows` says, per source, which rows the hold-out used
and from which token training takes each cut one (`HeldOutRows`, which every training part reads), so no token is
in both splits and none is lost. `HeldOut.hashes` name the documents it took tokens of: training drops any copy of
them (data/pieces.py). The source of each validation token is kept too (blocks join documents of several
sources), for the eval loss per source, and where each item starts (`report["item_starts"]`): a document cut at
its cap ends where a block ends, with no <|endoftext|>, so evaluation finds documents from this record.

The one check on a source made before training reads it (`check_training_left`): a source the hold-out read to its
end, leaving training less than one block, is refused here, for both scripts. What happens when a
source runs dry later is the loop's rule, ON_EXHAUSTED (data/blocks.py).
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparknet.common.errors import UserError
from sparknet.config.checks import check_values
from sparknet.data.blocks import StreamBlocks, initial_state
from sparknet.data.pipeline import Encoders, Pipeline, stop
from sparknet.data.spec import DataSpec, HeldOutRows, Part

log = logging.getLogger(__name__)


@dataclass
class HeldOut:
    """A hold-out: its blocks ([n_blocks, block_size]), each token's source ([n_blocks, block_size] indices into
    the report's `source_labels`, the mix's labels in its order), the rows of each source it used, the hashes of
    the documents it took tokens of, and its report (`report`)."""

    blocks: np.ndarray
    source_ids: np.ndarray
    rows: dict[str, HeldOutRows]
    hashes: list[str]
    report: dict[str, Any]


def hold_out(spec: DataSpec, progress: Any = None) -> HeldOut:
    """The validation blocks of `spec`: at least `spec.val_tokens` tokens in whole blocks from the start of the mix
    (fewer, with a warning, when the sources hold less). `progress(tokens)` is called as blocks are made."""
    check_values({"VAL_TOKENS": spec.val_tokens})
    wanted = math.ceil(spec.val_tokens / spec.block_size)
    labels = spec.labels
    encoders = pipeline = None
    try:
        encoders = Encoders(spec)
        pipeline = Pipeline(spec, Part(training=False), encoders)  # one process, the sources' own order
        loop = StreamBlocks(pipeline, initial_state(labels, {}), settings={})
        loop.packer.record_sources(labels)
        blocks = []
        for block in itertools.islice(loop.blocks(), wanted):
            blocks.append(block)
            if progress is not None:
                progress(spec.block_size)
        used = _documents_used(loop)
        rows = {label: HeldOutRows(rows=max((mark[1] for _, mark, _, _ in documents), default=0),
                                   rests={mark[1] - 1: stop for _, mark, stop, length in documents if stop < length})
                for label, documents in used.items()}
        hashes = sorted({document_hash for documents in used.values() for document_hash, *_ in documents})
        counts = loop.counts()
        # a source the hold-out used up (a small one): its size is known (known whatever was read ahead)
        sizes = {label: source.reader.rows if label in counts["exhausted"] else None
                 for label, source in pipeline.sources.items()}
        source_ids = loop.packer.source_ids().reshape(len(blocks), spec.block_size)
        item_starts = list(loop.packer.item_starts)
    finally:
        stop(pipeline.sources if pipeline is not None else {}, encoders, clean=False)
    if len(blocks) < wanted:
        log.warning("the sources hold only %d of the %d validation blocks asked", len(blocks), wanted)
    stacked = np.stack(blocks) if blocks else np.empty((0, spec.block_size), dtype=spec.token_dtype)
    report = {**_report(spec, counts, rows, sizes, len(blocks)), "item_starts": item_starts}
    rests = {label: sum(length - start for _, _, start, length in documents) for label, documents in used.items()}
    check_training_left(report, rests, spec)
    return HeldOut(stacked, source_ids, rows, hashes, report)


def check_training_left(report: dict[str, Any], rests: dict[str, int], spec: DataSpec) -> None:
    """Refuses, before any training, a source the hold-out (`report`) read to its end and left less than one block
    of training tokens (`rests`: per source, the tokens of the documents it cut, training's): training would get
    next to nothing of it and train on the other sources behind a warning (in a run in phases, a phase that mixes it
    would be all but empty). Any other source is left to the loop's ON_EXHAUSTED, where it runs dry (a source of one
    long document the hold-out took the start of trains on its rest)."""
    used_up = [(label, source["rows_in_source"], rests.get(label, 0)) for label, source in report["sources"].items()
               if source["rows_in_source"] is not None and source["rows_held_out"] >= source["rows_in_source"]
               and rests.get(label, 0) < spec.block_size]
    if used_up:
        named = "; ".join(f"source {label!r} ({rows} rows): all its rows read by the validation hold-out, "
                          f"{left} token(s) left to train on" for label, rows, left in used_up)
        raise UserError(f"{named} (VAL_TOKENS={spec.val_tokens:,}): lower VAL_TOKENS, give the source more data, or "
                        "leave it out of the mix")


def _documents_used(loop: StreamBlocks) -> dict[str, list[tuple[str, tuple[int, int], int, int]]]:
    """Per source, the documents the hold-out's blocks hold tokens of (`SourcePieces.used_documents`: hash, mark,
    the token training starts it at, length): the pieces used, and the tokens of the one being cut in the blocks
    given."""
    cutting = loop.cutting
    out = {}
    for label, source in loop.sources.items():
        used = loop.used(label)
        partial = 0
        if cutting is not None and cutting.label == label:  # counted as used, with its tokens in the blocks given
            used -= 1
            partial = max(0, cutting.offset)
        out[label] = source.used_documents(used, partial)
    return out


def _report(spec: DataSpec, counts: dict[str, Any], rows: dict[str, HeldOutRows], sizes: dict[str, int | None],
            blocks: int) -> dict[str, Any]:
    """The hold-out's report: blocks and tokens, and per source its tokens, pieces and realised share against the
    requested one, the rows it used, the source's rows when it was read to its end, its cap and the documents cut."""
    total = sum(counts["tokens"].values()) or 1
    probs = sum(source.prob for source in spec.config.mix)
    caps = spec.document_caps()
    return {
        "blocks": blocks,
        "tokens": blocks * spec.block_size,
        "requested_tokens": spec.val_tokens,
        "sources": {
            source.label: {
                "tokens": counts["tokens"][source.label],
                "documents": counts["documents"][source.label],
                "share": counts["tokens"][source.label] / total,
                "requested_share": source.prob / probs,
                "rows_held_out": rows[source.label].rows,
                "rows_in_source": sizes[source.label],  # None: not read to its end
                "exhausted": source.label in counts["exhausted"],
                "document_cap_tokens": caps[source.label],
                "documents_cut": len(rows[source.label].rests),
            }
            for source in spec.config.mix
        },
        "source_labels": spec.labels,  # what the tokens' source ids index
    }
