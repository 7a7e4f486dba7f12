"""What the packed build's manifest says beside its inputs: what was built from what (`description`), and per split
its blocks, tokens and documents with each source's realised share against the requested one (`split_report`).
`spec` is the build's BuildSpec (not imported here: sparknet.data.packed.build imports this module)."""

from __future__ import annotations

from typing import Any

import numpy as np

from sparknet.config import LABEL_RULE
from sparknet.data.encoding.packer import BlockPacker
from sparknet.data.mixing import Mixer
from sparknet.data.packed.dataset import FORMAT_VERSION, SPLITS, SplitWriter


def description(spec: Any, tok: Any, dtype: np.dtype, inputs: dict[str, Any], commits: dict[str, str | None],
                 trained_for: int | None) -> dict[str, Any]:
    """The manifest's account of what was built from what (beside the splits)."""
    config = spec.config
    return {
        "format_version": FORMAT_VERSION,
        "inputs": inputs,
        "tokenizer": {
            "path": spec.tokenizer,
            "sha256": inputs["tokenizer_sha256"],
            "vocab_size": len(tok),
            "eos_token_id": int(tok.eos_token_id),
            "eos_token": tok.eos_token,
            "model_max_length": trained_for,
        },
        "config": {"path": config.path, **config.to_dict()},
        "source_revisions": {s.label: {"revision": s.revision, "commit": commits.get(s.label)}
                             for s in config.mix if not s.local},
        "label_rule": LABEL_RULE,
        "seed": spec.seed,
        "block_size": spec.block_size,
        "dtype": dtype.name,
    }


def split_report(spec: Any, mixer: Mixer, packers: dict[str, BlockPacker], writers: dict[str, SplitWriter],
                 cut: dict[str, int], caps: dict[str, int]) -> dict[str, Any]:
    """The manifest's `splits`: blocks, tokens and documents per split, and per source its realised share against
    the requested one (validation: with its cap and documents cut)."""
    block = spec.block_size
    labels = list(mixer.counts)
    requested = {label: c.requested for label, c in mixer.counts.items()}
    splits = {}
    for name in SPLITS:
        p = packers[name]
        total = sum(p.tokens_by_source.values()) or 1
        splits[name] = {
            "file": f"{name}.bin",
            "blocks": writers[name].blocks,
            "tokens": writers[name].blocks * block,
            "documents": sum(p.documents_by_source.values()),
            "sha256": writers[name].content.record(),  # per chunk, as written (packed/contents.py)
            "sources": {
                label: {
                    "tokens": p.tokens_by_source[label],
                    "documents": p.documents_by_source[label],
                    "share": p.tokens_by_source[label] / total,
                    "requested_share": requested[label],
                    **({"document_cap_tokens": caps[label], "documents_cut": cut[label]} if name == "val" else {}),
                }
                for label in labels
            },
        }
    return splits
