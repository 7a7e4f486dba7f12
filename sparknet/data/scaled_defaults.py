"""Defaults that scale to the sources: VAL_TOKENS and SHUFFLE_BUFFER, when the user leaves them unset (None), so
that a few MB of one's own text works as the 1B-token recipe does. One rule for the build and the stream: both
scripts call these functions with the same config, so their own commands, defaults only, give the same tokens.

- VAL_TOKENS: one validation token per VAL_BYTES_PER_TOKEN bytes of the sources' files (about 2.5-4% of their
  tokens at 2.5-4 bytes per token), at most 1/VAL_SHARE_OF_BUDGET of the config's `target_tokens` and at most
  VAL_TOKENS_MOST. A fixed 2M held out the whole of a 4 MB corpus; the sources' size alone held out 1.1M tokens of
  109 MB of sources for a budget of 250k, so that one evaluation cost more than the whole training.
  The budget is the config's, not a script's TARGET_TOKENS or MAX_STEPS: the validation split decides every block
  after it, so a default that followed the size would make each size of a dataset other data (a growth would not be
  the fresh build of its size) and each run length another stream. A build or run much smaller than its config says
  so in a warning (its hold-out is more than a tenth of its training tokens) and VAL_TOKENS sets it.
- SHUFFLE_BUFFER: 1/BUFFER_ROWS_SHARE of the smallest local source's rows, at most 10,000: a buffer near a
  source's size holds most of it before giving its first document.

A value the user sets (in the script or as a flag) is kept as it is: only None scales. A Hub source's size is not
known before reading it: where it decides, the recipe's figure is kept. Each choice made from the data is one log
line. The chosen
values follow from the config and its local files alone (`source_size`), which every run's and dataset's identity
fingerprints, so a resumed run or a grown dataset gets the same values.

`source_size` says what a mix entry holds, known before it is read, and cheaply: the bytes of its local files (their
sizes on disk) and its rows (as its kind counts them, sparknet.config.kinds.LOCAL_KINDS: JSONL's lines, CSV's records,
Parquet's metadata, one per plain-text file). A Hub source's size is not known without reading it: None. Both follow
from the files alone (whose sha256 is part of every run's and dataset's inputs), so what is derived from them is the
same on every attempt at the same files.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sparknet.config.mix import MixConfig, SourceSpec, local_files

log = logging.getLogger(__name__)

VAL_TOKENS_MOST = 2_000_000  # VAL_TOKENS for sources of 200 MB or more (or unknown size) and a budget of 20M or more
SHUFFLE_BUFFER = 10_000  # SHUFFLE_BUFFER for sources of 200,000 rows or more (or unknown size)
VAL_BYTES_PER_TOKEN = 100
VAL_SHARE_OF_BUDGET = 10  # validation tokens are at most a tenth of the config's training budget (target_tokens)
BUFFER_ROWS_SHARE = 20  # the buffer is at most 1/20 (5%) of the smallest source's rows


def default_val_tokens(config: MixConfig, training_tokens: int | None = None, most: int = VAL_TOKENS_MOST) -> int:
    """VAL_TOKENS when unset: one per VAL_BYTES_PER_TOKEN bytes of the mix's local files (all of `most` when a Hub
    source's size is unknown), at most 1/VAL_SHARE_OF_BUDGET of the config's target_tokens and at most `most`; one
    line says which of them decided and the others' figures. `training_tokens`, the build's or run's own (a
    TARGET_TOKENS or MAX_STEPS smaller than the config's), decides nothing: a warning says when the hold-out is more
    than a tenth of them."""
    budget = config.target_tokens
    sizes = {spec.label: source_size(spec, row_limit=0) for spec in config.mix}
    unknown = [label for label, size in sizes.items() if size.bytes is None]
    total = sum(size.bytes or 0 for size in sizes.values())
    by_size = most if unknown else -(-total // VAL_BYTES_PER_TOKEN)
    by_budget = max(1, budget // VAL_SHARE_OF_BUDGET)
    chosen = max(1, min(most, by_size, by_budget))
    size_reason = (f"the size of {', '.join(unknown)} is not known before reading it" if unknown else
                   f"1 per {VAL_BYTES_PER_TOKEN} bytes of the sources' {total:,} bytes would be {by_size:,}")
    budget_reason = f"a tenth of the config's {budget:,} training tokens would be {by_budget:,}"
    log.info("VAL_TOKENS: %s validation tokens (%s; %s; at most %s; set VAL_TOKENS to choose)", f"{chosen:,}",
             size_reason, budget_reason, f"{most:,}")
    if training_tokens is not None and chosen > training_tokens // VAL_SHARE_OF_BUDGET:
        log.warning("VAL_TOKENS: the %s validation tokens are more than a tenth of the %s training tokens asked here "
                    "(the default follows the config's target_tokens, %s, so that every size holds out the same "
                    "split): set VAL_TOKENS to hold out fewer", f"{chosen:,}", f"{training_tokens:,}", f"{budget:,}")
    return chosen


def default_shuffle_buffer(config: MixConfig, most: int = SHUFFLE_BUFFER) -> int:
    """SHUFFLE_BUFFER when unset (the build's and the stream's): 1/BUFFER_ROWS_SHARE of the rows of the smallest
    source whose rows are known, at most `most` (all of it when no source's rows are known)."""
    limit = most * BUFFER_ROWS_SHARE  # past this many rows a source does not lower the buffer: no need to count on
    rows = {spec.label: size.rows for spec in config.mix
            if (size := source_size(spec, row_limit=limit)).rows is not None}
    if not rows:
        # the recipe's figure, nothing scaled: not said at INFO (a first line stays the error, if any)
        log.debug("SHUFFLE_BUFFER: %s documents per source (no source's rows are known before reading it; set "
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


@dataclass(frozen=True)
class SourceSize:
    """A source's size on disk: None where it cannot be known cheaply (a Hub source; rows of a JSON array file).
    `rows` stops counting past `row_limit` (then it is that limit: "at least")."""

    bytes: int | None
    rows: int | None


def source_size(spec: SourceSpec, row_limit: int | None = None) -> SourceSize:
    """The bytes and rows of a local entry (rows counted up to `row_limit`); both None for a Hub source."""
    if spec.local is None:
        return SourceSize(None, None)
    files = [Path(real) for _named, real in local_files(vars(spec))]
    if not files:
        return SourceSize(None, None)
    total_bytes = sum(path.stat().st_size for path in files)  # compressed files: a lower bound of the text
    rows: int | None = 0
    for path in files:
        left = None if row_limit is None else row_limit - rows
        counted = spec.local.count_rows(path, left)
        if counted is None:
            rows = None
            break
        rows += counted
        if row_limit is not None and rows >= row_limit:
            rows = row_limit
            break
    return SourceSize(total_bytes, rows)

