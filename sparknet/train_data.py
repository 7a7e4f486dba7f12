"""What a trainer trains on: its blocks, its validation blocks, its tokenizer, and what they add to the run's
identity and metadata. The two trainers differ only here: the packed dataset (scripts/train_sparknet_v5.py) or
the live stream (scripts/train_sparknet.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparknet.config import MixConfig
from sparknet.errors import UserError

log = logging.getLogger("sparknet.train")


@dataclass
class DataPlan:
    """A trainer's data, ready for the Trainer."""

    train: Any  # a torch Dataset (random access) or IterableDataset of {"input_ids", "labels"} blocks
    val: Any  # a torch Dataset of validation blocks
    val_tokens: np.ndarray  # the validation blocks' tokens, [blocks, block_size]
    block_size: int
    tokenizer: Any
    tokenizer_source: str
    target_tokens: int  # the budget when TARGET_TOKENS is not set
    identity: dict[str, Any]  # what about the data makes a run this run (compared on resume)
    metadata: dict[str, Any]  # what training_metadata.json records about the data
    train_blocks: int | None = None  # for the passes-over-the-data line; None for a stream
    callbacks: list[Any] = field(default_factory=list)  # TrainerCallbacks the data needs (e.g. saving its state)
    trainer_overrides: dict[str, Any] = field(default_factory=dict)  # TrainingArguments the data needs


def packed_plan(dataset_dir: str, tokenizer_dir: str | None, config: MixConfig | None) -> DataPlan:
    """The packed dataset (scripts/build_dataset_v5.py) with the tokenizer it was built with.

    `config`, the script's CONFIG, is checked against the mix the dataset was built from."""
    from sparknet.data.packed import PackedDataset
    from sparknet.tokenizer import load_tokenizer, tokenizer_fingerprint

    train = PackedDataset(dataset_dir, "train")
    val = PackedDataset(dataset_dir, "val")
    manifest = train.manifest
    if config is not None and config.to_dict()["mix"] != manifest["config"]["mix"]:
        log.warning("dataset %s was built from another mix than CONFIG=%s (%s): the metadata records the dataset's",
                    train.folder, config.path, manifest["config"]["path"])
    source = tokenizer_dir or manifest["tokenizer"]["path"]
    tokenizer = load_tokenizer(source)
    if tokenizer_fingerprint(source, tokenizer) != manifest["tokenizer"]["sha256"]:
        raise UserError(f"tokenizer {source} is not the one dataset {train.folder} was built with "
                        f"({manifest['tokenizer']['path']}, sha256 {manifest['tokenizer']['sha256'][:12]}...): "
                        "rebuild the dataset with this tokenizer, or point TOKENIZER_DIR at the original one")
    if len(val) == 0:
        raise UserError(f"dataset {val.folder} has no validation blocks: rebuild it with VAL_TOKENS > 0")
    return DataPlan(
        train=train,
        val=val,
        val_tokens=np.asarray(val.tokens),
        block_size=train.block_size,
        tokenizer=tokenizer,
        tokenizer_source=source,
        target_tokens=manifest["config"]["target_tokens"],
        identity={"dataset_dir": dataset_dir, "dataset_inputs": manifest.get("inputs")},
        metadata={
            "config": manifest["config"],
            "dataset": {"path": str(train.folder), "inputs": manifest.get("inputs"),
                        "realised_mixture": {k: v["sources"] for k, v in manifest["splits"].items()}},
        },
        train_blocks=len(train),
    )
