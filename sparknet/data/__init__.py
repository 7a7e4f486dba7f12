"""The data path: texts from the mix's sources to the blocks the Trainer reads, exactly mixed and exactly resumable.

The folder reads as the flow, one concept per name:

    spec        one description of the data (DataSpec) and of the part of the stream (Part), passed whole
    source/     a mix entry as a lazy stream of texts: opening it (Hub id or local files, revisions), the Hub's
                transient failures retried from the row reached, and the reader of one rank with its position
       |
    encoding/   texts to tokens with <|endoftext|> after each document, on encoder processes, a bounded number of
                batches ahead; the packer that cuts the token stream into fixed blocks
       |
    pieces      a long document in pieces, a validation document repeated in training dropped
       |
    mixing      the next piece from the source furthest behind its token share: every prefix carries the mix
       |
    pipeline    the four wired once for one part, from a saved position
       |
    blocks      the one packing loop: blocks one at a time, each with its position
       |
    holdout     the validation part: the first blocks of the mix, the same for the build and the stream
       |
       +-- packed/   the packed dataset: the stream at one process written to split files, its manifest, the reader
       +-- stream/   the stream for the streaming trainer: blocks shuffled in windows, its position in checkpoints

What the trainers and the build use is handed on here (`from sparknet.data import DataSpec, Part, hold_out,
PackedDataset, TokenStream`), imported on first use so that importing `sparknet.data` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DataSpec", "PackedDataset", "Part", "TokenStream", "hold_out"]


def __getattr__(name: str) -> Any:
    if name == "PackedDataset":
        from sparknet.data.packed.dataset import PackedDataset

        return PackedDataset
    if name == "TokenStream":
        from sparknet.data.stream.token_stream import TokenStream

        return TokenStream
    if name in ("DataSpec", "Part"):
        from sparknet.data import spec

        return getattr(spec, name)
    if name == "hold_out":
        from sparknet.data.holdout import hold_out

        return hold_out
    raise AttributeError(f"module 'sparknet.data' has no attribute {name!r}")
