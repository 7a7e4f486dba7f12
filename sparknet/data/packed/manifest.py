"""What the packed build's manifest says beside its inputs: what was built from what (`description`), and per split
its blocks, tokens and documents with each source's realised share against the requested one (`split_report`).
`spec` is the build's BuildSpec (not imported here: sparknet.data.packed.build imports this module)."""

from __future__ import annotations

from typing import Any

import numpy as np

from sparknet.config.mix import LABEL_RULE
from sparknet.data.packed.dataset import FORMAT_VERSION, SPLITS, SplitWriter
from sparknet.data.source.opening import text_column
from sparknet.data.spec import PIECE_BLOCKS

# How far a split's realised share may stand from the requested one before the mix counts as missed: 2 points, or
# the longest item's share of the split (a validation document's cap, a training piece) where that is more.
SHARE_TOLERANCE = 0.02


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
        # the column each source's documents were read from (its text_field, or the one picked from its columns;
        # input_ids for a pre-tokenized source); None: not known (a Hub source that could not be opened again)
        "text_columns": {s.label: text_column(s) for s in config.mix},
        "label_rule": LABEL_RULE,
        "seed": spec.seed,
        "block_size": spec.block_size,
        "dtype": dtype.name,
    }


def split_report(spec: Any, held: dict[str, Any], counts: dict[str, Any],
                 writers: dict[str, SplitWriter]) -> dict[str, Any]:
    """The manifest's `splits`: blocks, tokens and pieces per split (a long document counts once per piece), and per
    source its realised share against the requested one (validation: with its cap and documents cut, from the
    hold-out's report `held["report"]`; training: from the training part's `counts`, with the documents removed for
    repeating a validation document)."""
    block = spec.block_size
    # the run-wide mix (a config in phases: the phases' token-weighted)
    total_prob = sum(s.prob for s in spec.config.mix)
    requested = {s.label: s.prob / total_prob for s in spec.config.mix}
    val_sources = held["report"]["sources"]
    train_total = sum(counts["tokens"].values()) or 1
    sources = {
        "val": {label: {key: val_sources[label][key] for key in ("tokens", "documents", "share", "requested_share",
                                                                 "document_cap_tokens", "documents_cut")}
                for label in requested},
        "train": {label: {"tokens": counts["tokens"][label], "documents": counts["documents"][label],
                          "share": counts["tokens"][label] / train_total, "requested_share": requested[label],
                          "piece_tokens": PIECE_BLOCKS * block,
                          "validation_repeats_removed": counts["validation_repeats_removed"][label]}
                  for label in requested},
    }
    splits = {}
    for name in SPLITS:
        splits[name] = {
            "file": f"{name}.bin",
            "blocks": writers[name].blocks,
            "tokens": writers[name].blocks * block,
            "documents": sum(source["documents"] for source in sources[name].values()),
            "sha256": writers[name].content.record(),  # per chunk, as written (packed/dataset.py)
            "sources": sources[name],
        }
    splits["val"]["source_ids"] = held["source_ids"]
    # where each validation item starts in val.bin's tokens (evaluation's documents: data/holdout.py)
    splits["val"]["item_starts"] = held["report"]["item_starts"]
    return splits


def phase_report(spec: Any, boundaries: list[dict[str, int]], starts: list[int], tokens_at_end: dict[str, int],
                 blocks: int) -> list[dict[str, Any]]:
    """The training split's phases (a config in phases): each one's block range, and per source its tokens in those
    blocks and realised share against the phase's prob, with `complete` (at least the blocks its share asks: a phase
    after one whose sources ran dry began early and holds more; its mix met) and `shares_missed`. `boundaries`,
    `starts`: each source's tokens at every boundary passed and the block the next phase began at; `tokens_at_end`,
    `blocks`: the training split's, at the end."""
    config = spec.config
    ends = config.phase_ends(spec.target_tokens // spec.block_size)
    counts = [*boundaries, dict(tokens_at_end)]
    edges = [0, *starts, blocks]  # phases the sources never reached are empty, at the end
    out = []
    for i, phase in enumerate(config.phases):
        start, written = edges[min(i, len(edges) - 1)], edges[min(i + 1, len(edges) - 1)]
        before = counts[i - 1] if 0 < i <= len(counts) else {}
        after = counts[i] if i < len(counts) else before
        tokens = {s.label: int(after.get(s.label, 0)) - int(before.get(s.label, 0)) for s in config.mix}
        total = sum(tokens.values())
        probs = phase.prob_of()
        report = {
            "name": phase.name,
            "run_share": phase.share,
            "blocks": [start, written],
            "tokens": total,
            "sources": {label: {"tokens": n, "share": n / (total or 1), "requested_share": probs.get(label, 0.0)}
                        for label, n in tokens.items()},
        }
        missed = missed_shares({"phase": report}, spec.block_size).get("phase", [])
        asked = ends[i] - (ends[i - 1] if i else 0)
        report.update(complete=written - start >= asked and not missed, shares_missed=missed)
        out.append(report)
    return out


def missed_shares(splits: dict[str, Any], block_size: int) -> dict[str, list[str]]:
    """Per split, the sources whose realised share misses the requested one by more than the tolerance (a source that
    ran dry, a mix too small for its longest items); splits that meet the mix are left out."""
    missed: dict[str, list[str]] = {}
    for name, split in splits.items():
        tokens = split["tokens"] or 1
        for label, source in split["sources"].items():
            longest = source.get("document_cap_tokens") or source.get("piece_tokens") or block_size
            if abs(source["share"] - source["requested_share"]) > max(SHARE_TOLERANCE, longest / tokens):
                missed.setdefault(name, []).append(label)
    return missed
