"""One description of the data, built once from a script's constants and passed whole through the data path.

- `DataSpec`: what every block depends on besides the part and the position: the sources (a config, read at
  recorded commits), the tokenizer, the block size, the seed, the shuffle buffer, the validation size (whose
  per-source document caps follow from it) and how the work is spread (encoding processes, batch sizes, read-ahead).
- `Part`: which part of the mixed stream: the validation hold-out (its first blocks, read in the sources' order by
  one process), or training for rank `rank` of `world_size`, after the rows the hold-out used (`HeldOutRows`) and
  without the documents it holds (`exclude`).
- `HeldOutRows`: per source, the first `rows` rows belong to the hold-out, except the documents it took only the
  first tokens of (`rests`: row -> the token where training starts it).

The packed build is the stream at rank 0 of 1 written to disk: both build these two and run data/blocks.py.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparknet.config.mix import MixConfig


def data_rule(on_exhausted: str) -> str:
    """ON_EXHAUSTED as it shapes the data, for what identifies a run, a position or a dataset: `fail` gives what
    `renormalise` gives, or stops with an error, so a run stopped by it continues without it."""
    return "renormalise" if on_exhausted == "fail" else on_exhausted

# Blocks per piece of a long document (data/pieces.py). Smaller pieces hold every prefix closer to the mix; 8 blocks
# keep a source within 4 blocks of its share in any prefix.
PIECE_BLOCKS = 8
VAL_DOCUMENTS_PER_SOURCE = 20  # documents of each source a validation split can always hold (`document_caps`)


def token_dtype(vocab_size: int, requested: str = "auto") -> np.dtype:
    """uint16 when every id fits, else uint32; a requested dtype too small for the vocabulary is refused."""
    from sparknet.common.errors import UserError
    from sparknet.config.checks import check_values

    check_values({"DTYPE": requested})  # the choices are the DTYPE rule's
    if requested == "auto":
        return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)
    dtype = np.dtype(requested)
    if vocab_size > np.iinfo(dtype).max + 1:
        raise UserError(
            f"a vocabulary of {vocab_size} tokens overflows {requested} (ids up to "
            f"{np.iinfo(dtype).max}): use DTYPE=uint32 or auto"
        )
    return dtype


@dataclass(frozen=True)
class HeldOutRows:
    """One source's rows that the validation hold-out used: the first `rows`, of which those in `rests` only up to
    a token (the rest of that document is training's, from that token on)."""

    rows: int = 0
    rests: Mapping[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "rests": {str(row): offset for row, offset in sorted(self.rests.items())}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HeldOutRows:
        return cls(int(data["rows"]), {int(row): int(offset) for row, offset in dict(data.get("rests") or {}).items()})


@dataclass(frozen=True)
class Part:
    """Which part of the mixed stream a pipeline gives (see the module docstring). `on_exhausted` is the rule for a
    source that runs dry (sparknet.config.checks' ON_EXHAUSTED); `phase_ends` where each phase of a run in phases ends,
    in blocks of this part; `window_blocks`: blocks shuffled together (0: in the stream's order; the packed build
    writes that order, the streaming trainer shuffles, data/stream/token_stream.py); `end_blocks`: the blocks this
    part will be asked for at most (None: unknown), so that a window never reaches past them."""

    training: bool = True
    rank: int = 0
    world_size: int = 1
    held_out: Mapping[str, HeldOutRows] = field(default_factory=dict)
    exclude: frozenset[str] = frozenset()
    on_exhausted: str = "renormalise"
    phase_ends: tuple[int, ...] | None = None
    window_blocks: int = 0
    end_blocks: int | None = None

    def settings(self) -> dict[str, Any]:
        """What a saved position of this part depends on (the part's side of a position's identity)."""
        return {
            "part": "training" if self.training else "validation",
            "rank": self.rank,
            "world_size": self.world_size,
            **({"held_out": {label: rows.to_dict() for label, rows in sorted(self.held_out.items())}}
               if self.held_out else {}),
            **({"excluded_documents_sha256": hashlib.sha256(" ".join(sorted(self.exclude)).encode()).hexdigest()}
               if self.exclude else {}),
            "on_exhausted": data_rule(self.on_exhausted),
            **({"phase_end_blocks": list(self.phase_ends)} if self.phase_ends is not None else {}),
            "window_blocks": self.window_blocks,
            **({"end_blocks": self.end_blocks} if self.window_blocks and self.end_blocks is not None else {}),
        }


@dataclass(frozen=True)
class DataSpec:
    """The data (see the module docstring). `val_tokens` sizes the hold-out; `num_workers` encoding processes (0:
    this one); `batch_docs`/`batch_chars` bound an encoding batch; `read_ahead`: batches each source reads ahead on
    a thread (None: 8 for a Hub source, whose network waits release the GIL, 0 for local files); `dtype`: the token
    dtype's rule (sparknet.config.checks' DTYPE)."""

    config: MixConfig
    tokenizer_json: str
    eos_id: int
    block_size: int
    seed: int
    val_tokens: int = 0
    shuffle_buffer: int = 0
    num_workers: int = 0
    batch_docs: int = 256
    batch_chars: int = 1 << 20
    read_ahead: int | None = 0
    dtype: str = "auto"  # of the tokens: auto (uint16 when the vocabulary fits), uint16 or uint32

    @property
    def labels(self) -> list[str]:
        return [source.label for source in self.config.mix]

    @property
    def piece_tokens(self) -> int:
        """The longest item a source hands the mixer (data/pieces.py)."""
        return PIECE_BLOCKS * self.block_size

    @property
    def vocab_size(self) -> int:
        from tokenizers import Tokenizer

        return Tokenizer.from_str(self.tokenizer_json).get_vocab_size()

    @property
    def token_dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size, self.dtype)

    def document_caps(self) -> dict[str, int]:
        """The most tokens of one document the hold-out takes, per source: `val_tokens × its prob / 20`. Mixing by
        tokens carries the mix to within about half an item per source, which is ±2 points only once a split holds
        ~20 items of each; the rest of a longer document is training's."""
        total = sum(source.prob for source in self.config.mix)
        return {source.label: max(2, math.ceil(self.val_tokens * source.prob / total / VAL_DOCUMENTS_PER_SOURCE))
                for source in self.config.mix}

    def settings(self) -> dict[str, Any]:
        """What the blocks depend on (the data's side of a position's identity; not how the work is spread)."""
        return {
            "sources": self.config.to_dict()["mix"],
            **({"phases": self.config.to_dict()["phases"]} if self.config.phased else {}),
            "tokenizer_sha256": hashlib.sha256(self.tokenizer_json.encode()).hexdigest(),
            "eos_id": self.eos_id,
            "block_size": self.block_size,
            "seed": self.seed,
            "shuffle_buffer": self.shuffle_buffer,
            "val_tokens": self.val_tokens,
            "piece_tokens": self.piece_tokens,
        }
