"""The streaming trainer's validation blocks: held out from the start of the mixed stream, the same on every rank
and for any number of ranks, with the rows of each source they used, so that training never reads them, and the
source of each of their tokens (blocks join documents of several sources), for the eval loss per source."""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparknet.checks import check_values
from sparknet.config import MixConfig
from sparknet.data.encoding.packer import val_document_caps
from sparknet.data.stream.token_stream import TokenStream

log = logging.getLogger(__name__)


@dataclass
class HeldOut:
    """A hold-out: its blocks, the rows of each source they used, their report (see `hold_out_validation`), and
    each token's source ([n_blocks, block_size] indices into `source_labels`, the mix's labels in its order)."""

    blocks: np.ndarray
    rows: dict[str, int]
    report: dict[str, Any]
    source_ids: np.ndarray
    source_labels: list[str]


def hold_out_validation(**kw: Any) -> tuple[np.ndarray, dict[str, int], dict[str, Any]]:
    """The validation blocks, the rows of each source they used and their report: `hold_out`'s first three."""
    held = hold_out(**kw)
    return held.blocks, held.rows, held.report


def hold_out(
    *,
    config: MixConfig,
    tokenizer_json: str,
    eos_id: int,
    block_size: int,
    val_tokens: int,
    seed: int,
    shuffle_buffer: int = 0,
    num_workers: int = 0,
) -> HeldOut:
    """The validation blocks ([n_blocks, block_size], uint16/uint32; at least `val_tokens` tokens in whole blocks),
    taken from the start of the mixed stream, unsharded (the same on every rank); the rows of each source they used
    (pass as `skip_documents` to TokenStream so that training never reads them); and a report of their shares.
    Documents longer than their source's cap (`packer.val_document_caps`) are cut, so that the blocks carry the
    mix within ±2 points; the rest of a cut document is never trained on either. The report's "document_hashes"
    name the documents held out: pass them as `exclude_documents` to TokenStream so that no copy of one (in
    another file, source or row) is trained on.

    With a shuffle buffer the rows skipped also hold the documents still in the buffer: at most `shuffle_buffer`
    documents per source are then neither validated nor trained on.
    """
    check_values({"VAL_TOKENS": val_tokens})
    wanted = math.ceil(val_tokens / block_size)
    caps = val_document_caps({s.label: s.prob for s in config.mix}, val_tokens)
    stream = TokenStream(config=config, tokenizer_json=tokenizer_json, eos_id=eos_id, block_size=block_size,
                         seed=seed, shuffle_buffer=shuffle_buffer, num_workers=num_workers, document_caps=caps)
    labels = [s.label for s in config.mix]
    try:
        live = stream.start()
        live.packer.record_sources(labels)
        blocks = list(itertools.islice(live.blocks(), wanted))
        source_ids = live.packer.source_ids().reshape(len(blocks), block_size)
        rows = live.rows_used()
        stats = stream.stats()
        cut = dict(live.pipeline.caps.documents_cut)
        hashes = sorted(live.pipeline.held_out_hashes)  # every document with tokens in the blocks
        # a source read to its end while holding out (small, or a shuffle buffer larger than it): its size is known
        sizes = {label: source.reader.rows if source.reader.draining or source.reader.passes else None
                 for label, source in live.sources.items()}
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
        # the hold-out's documents, by the hash of their tokens (data/pieces.py): training drops any repeat of them
        "document_hashes": hashes,
        "source_labels": labels,  # what the tokens' source ids (VAL_SOURCES in the run folder) index
    }
    return HeldOut(np.stack(blocks), rows, report, source_ids, labels)
