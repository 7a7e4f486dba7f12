"""The data path: texts from the mix's sources to the blocks the Trainer reads, exactly mixed and exactly resumable.

The folder reads as the flow, one concept per name:

    source/     a mix entry as a lazy stream of texts: opening it (Hub id or local files, revisions), the Hub's
                transient failures retried from the row reached, and the reader of one rank with its position
       |
    encoding/   texts to tokens with <|endoftext|> after each document, on encoder processes, a bounded number of
                batches ahead; the packer that cuts the token stream into fixed blocks
       |
    mixing      the next document from the source furthest behind its token share: every prefix carries the mix
       |
    pipeline    the three wired once, from a saved position (the same for the build and the stream)
       |
       +-- packed/   the packed dataset: the build into split files, its resumable state, its manifest, the reader
       +-- stream/   the blocks cut on the fly for the streaming trainer, its validation hold-out, its position

What the Trainer reads is handed on here (`from sparknet.data import PackedDataset, TokenStream`), imported on
first use so that importing `sparknet.data` stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PackedDataset", "TokenStream", "hold_out_validation"]


def __getattr__(name: str) -> Any:
    if name == "PackedDataset":
        from sparknet.data.packed.dataset import PackedDataset

        return PackedDataset
    if name == "TokenStream":
        from sparknet.data.stream.token_stream import TokenStream

        return TokenStream
    if name == "hold_out_validation":
        from sparknet.data.holdout import hold_out_validation

        return hold_out_validation
    raise AttributeError(f"module 'sparknet.data' has no attribute {name!r}")
