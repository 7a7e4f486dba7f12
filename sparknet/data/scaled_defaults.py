"""Defaults that scale to the sources: VAL_TOKENS (the build's and the stream's) and the stream's SHUFFLE_BUFFER,
when the user leaves them unset (None), so that a few MB of one's own text works as the 1B-token recipe does.

- VAL_TOKENS: one validation token per VAL_BYTES_PER_TOKEN bytes of the sources' files (about 2.5-4% of their
  tokens at 2.5-4 bytes per token), at most 1/VAL_SHARE_OF_BUDGET of the training budget and at most the recipe's
  figure (2M for a build, 1M for the stream). A fixed 2M held out the whole of a 4 MB corpus; the sources' size
  alone held out 1.1M tokens of 109 MB of sources for a budget of 250k, so that one evaluation cost more than the
  whole training.
- SHUFFLE_BUFFER (the stream): 1/BUFFER_ROWS_SHARE of the smallest local source's rows, at most 10,000: a buffer
  near a source's size shuffles little (it holds most of the source before giving its first document).

A value the user sets (in the script or as a flag) is kept as it is: only None scales. A Hub source's size is not
known before reading it: where it decides, the recipe's figure is kept. Each choice is one log line. The chosen
values follow from the local files alone (`source/sizes.py`), which every run's and dataset's identity fingerprints,
so a resumed run gets the same values.
"""

from __future__ import annotations

import logging

from sparknet.config import MixConfig
from sparknet.data.source.sizes import source_size

log = logging.getLogger(__name__)

BUILD_VAL_TOKENS = 2_000_000  # the build's VAL_TOKENS for sources of 200 MB or more (or unknown size)
STREAM_VAL_TOKENS = 1_000_000  # the stream's, for sources of 100 MB or more
SHUFFLE_BUFFER = 10_000  # the stream's SHUFFLE_BUFFER for sources of 200,000 rows or more (or unknown size)
VAL_BYTES_PER_TOKEN = 100
VAL_SHARE_OF_BUDGET = 10  # validation tokens are at most a tenth of the training budget (TARGET_TOKENS)
BUFFER_ROWS_SHARE = 20  # the buffer is at most 1/20 (5%) of the smallest source's rows


def default_val_tokens(config: MixConfig, most: int, target_tokens: int | None = None) -> int:
    """VAL_TOKENS when unset: one per VAL_BYTES_PER_TOKEN bytes of the mix's local files (all of `most` when a Hub
    source's size is unknown), at most 1/VAL_SHARE_OF_BUDGET of the training budget (`target_tokens`, else the
    config's) and at most `most`; one line says which of them decided and the others' figures."""
    budget = target_tokens if target_tokens is not None else config.target_tokens
    sizes = {spec.label: source_size(spec, row_limit=0) for spec in config.mix}
    unknown = [label for label, size in sizes.items() if size.bytes is None]
    total = sum(size.bytes or 0 for size in sizes.values())
    by_size = most if unknown else -(-total // VAL_BYTES_PER_TOKEN)
    by_budget = max(1, budget // VAL_SHARE_OF_BUDGET)
    chosen = max(1, min(most, by_size, by_budget))
    size_reason = (f"the size of {', '.join(unknown)} is not known before reading it" if unknown else
                   f"1 per {VAL_BYTES_PER_TOKEN} bytes of the sources' {total:,} bytes would be {by_size:,}")
    budget_reason = f"a tenth of the {budget:,} training tokens would be {by_budget:,}"
    log.info("VAL_TOKENS: %s validation tokens (%s; %s; at most %s; set VAL_TOKENS to choose)", f"{chosen:,}",
             size_reason, budget_reason, f"{most:,}")
    return chosen


def default_shuffle_buffer(config: MixConfig, most: int = SHUFFLE_BUFFER) -> int:
    """The stream's SHUFFLE_BUFFER when unset: 1/BUFFER_ROWS_SHARE of the rows of the smallest source whose rows are
    known, at most `most` (all of it when no source's rows are known)."""
    limit = most * BUFFER_ROWS_SHARE  # past this many rows a source does not lower the buffer: no need to count on
    rows = {spec.label: size.rows for spec in config.mix
            if (size := source_size(spec, row_limit=limit)).rows is not None}
    if not rows:
        log.info("SHUFFLE_BUFFER: %s documents per source (no source's rows are known before reading it; set "
                 "SHUFFLE_BUFFER to choose)", f"{most:,}")
        return most
    smallest = min(rows, key=lambda label: (rows[label], label))
    chosen = min(most, rows[smallest] // BUFFER_ROWS_SHARE)
    if chosen == most:
        log.info("SHUFFLE_BUFFER: %s documents per source (set SHUFFLE_BUFFER to choose)", f"{most:,}")
    else:
        log.info("SHUFFLE_BUFFER: %s documents per source, 1/%d of the %s rows of %r, the smallest source (at most "
                 "%s; set SHUFFLE_BUFFER to choose)", f"{chosen:,}", BUFFER_ROWS_SHARE, f"{rows[smallest]:,}",
                 smallest, f"{most:,}")
    return chosen
