"""The data pipeline: sources -> mixing -> packing -> the packed (static) dataset or the stream.

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
        from sparknet.data.stream.holdout import hold_out_validation

        return hold_out_validation
    raise AttributeError(f"module 'sparknet.data' has no attribute {name!r}")
