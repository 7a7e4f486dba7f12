"""What a trainer trains on: its blocks, its validation blocks, its tokenizer, and what they add to the run's
identity and metadata. The two trainers differ only here: `DataPlan` is the base (a plan needs nothing more than
its fields), `PackedPlan` the packed dataset (scripts/train_sparknet_v5.py) and `StreamPlan` (train/stream_plan.py)
the live stream (scripts/train_sparknet.py), in the shape of LitGPT's `DataModule`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sparknet.common.errors import UserError
from sparknet.config.mix import MixConfig

if TYPE_CHECKING:
    from sparknet.train.batch import BatchPlan

log = logging.getLogger("sparknet.train")


@dataclass(kw_only=True)
class DataPlan:
    """A trainer's data, ready for the Trainer. The methods are the hooks a plan may add to a run; the base's do
    nothing."""

    train: Any  # a torch Dataset (random access) or IterableDataset of {"input_ids", "labels"} blocks
    val: Any  # a torch Dataset of validation blocks
    val_tokens: np.ndarray  # the validation blocks' tokens, [blocks, block_size]
    block_size: int
    tokenizer: Any
    tokenizer_source: str
    target_tokens: int  # the budget when TARGET_TOKENS is not set
    identity: dict[str, Any]  # what about the data makes a run this run (compared on resume)
    train_blocks: int | None = None  # for the passes-over-the-data line; None for a stream
    # the source of each validation token, [blocks, block_size] indices into `source_labels` (the mix's labels in
    # its order), for the eval loss per source; None: not known (then only the overall figures are written)
    val_sources: np.ndarray | None = None
    source_labels: list[str] = field(default_factory=list)
    # identity that cannot change even with ALLOW_CONFIG_CHANGE, with why: {key: (value, reason and fix)}
    fixed_identity: dict[str, tuple[Any, str]] = field(default_factory=dict)
    # TrainingArguments the data needs (given to its constructor, so that its checks see them)
    trainer_arguments: dict[str, Any] = field(default_factory=dict)
    # a run in phases (config "phases"): each phase's name and share of the run's training tokens; empty: one phase
    phases: tuple[tuple[str, float], ...] = ()
    phase_steps: list[int] | None = None  # where each phase's steps end (plan_phases), in a run of several

    def plan_phases(self, max_steps: int, batch: BatchPlan) -> list[int] | None:
        """Where each phase's optimizer steps end (the shares of `max_steps`, at whole steps), logged, or None for a
        run of one phase. A plan whose data must know (the stream's switch, the packed phases' sizes) adds to it."""
        if len(self.phases) < 2:
            return None
        from sparknet.train.phases import check_every_phase_trains

        self.phase_steps = ends = check_every_phase_trains(self.phases, max_steps,
                                                           batch.global_batch * self.block_size)
        notes = [self.phase_note(k, batch) for k in range(len(self.phases))]
        log.info("phases: %s", ", ".join(f"{name} steps {(ends[k - 1] if k else 0) + 1}-{ends[k]}"
                                         + (f" ({notes[k]})" if notes[k] else "")
                                         for k, (name, _) in enumerate(self.phases)))
        return ends

    def phase_note(self, index: int, batch: BatchPlan) -> str:
        """What the phases' log line says of phase `index` beside its steps (`phase_steps` set); nothing here."""
        return ""

    def phase_record(self) -> list[dict[str, Any]]:
        """The metadata's `phases`: each phase's name and its first and last optimizer step (none: one phase)."""
        ends = self.phase_steps or []
        return [{"name": name, "steps": [(ends[k - 1] if k else 0) + 1, ends[k]]}
                for k, (name, _) in enumerate(self.phases) if ends]

    def metadata(self) -> dict[str, Any]:
        """What training_metadata.json records about the data (read when it is written: the end of training)."""
        return {}

    def eval_dataset(self) -> Any:
        """What the Trainer evaluates on: the validation blocks, each with its tokens' sources when they are known."""
        return self.val if self.val_sources is None else SourcedBlocks(self.val, self.val_sources)

    def callbacks(self, writer: Any) -> list[Any]:
        """TrainerCallbacks the data needs (e.g. saving its position), given the TensorBoard writer."""
        return []

    def prepare_run(self, run_dir: Path, resume: Path | None) -> None:
        """Called once the run folder is open, with the checkpoint resumed from (or None)."""

    def close(self) -> None:
        """Releases what the data holds (e.g. encoding processes)."""


@dataclass(kw_only=True)
class PackedPlan(DataPlan):
    """The packed dataset: its manifest's record of the data goes into the metadata."""

    manifest_metadata: dict[str, Any]

    def plan_phases(self, max_steps: int, batch: BatchPlan) -> list[int] | None:
        """The base's, each phase's passes over its blocks logged, and each phase that has steps checked to hold one
        global batch, before the run folder."""
        ends = super().plan_phases(max_steps, batch)
        for k, (name, _) in enumerate(self.phases if ends else ()):
            start, end = self.train.phases[k][1:]
            if ends[k] > (ends[k - 1] if k else 0) and end - start < batch.global_batch:
                raise UserError(f"phase {name} of dataset {self.train.folder} has {end - start} training blocks, "
                                f"fewer than one global batch (GLOBAL_BATCH_SIZE={batch.global_batch}): lower "
                                "GLOBAL_BATCH_SIZE, or build the dataset with more tokens")
        return ends

    def _passes(self, phases: list[int], batch: BatchPlan) -> float:
        """How many times the steps of `phases` (0-based) train each of their blocks, on average."""
        ends = self.phase_steps or []
        steps = sum(ends[k] - (ends[k - 1] if k else 0) for k in phases)
        blocks = sum(self.train.phases[k][2] - self.train.phases[k][1] for k in phases)
        return steps * batch.global_batch / max(blocks, 1)

    def phase_note(self, index: int, batch: BatchPlan) -> str:
        start, end = self.train.phases[index][1:]
        return f"{self._passes([index], batch):.2f} passes over its {end - start:,} blocks"

    def metadata(self) -> dict[str, Any]:
        if self.phase_steps:  # with each phase's blocks
            return {**self.manifest_metadata, "phases": [{**record, "blocks": list(self.train.phases[k][1:])}
                                                         for k, record in enumerate(self.phase_record())]}
        return self.manifest_metadata

    def callbacks(self, writer: Any) -> list[Any]:
        from sparknet.train.phases import PhaseCallback

        return [PhaseCallback(writer=writer, ends=self.phase_steps)] if self.phase_steps else []


def packed_plan(dataset_dir: str, tokenizer_dir: str | None, config: MixConfig | None) -> PackedPlan:
    """The packed dataset (scripts/build_dataset_v5.py) with the tokenizer it was built with.

    `config`, the script's CONFIG, must be the mix the dataset was built from (the metadata and the card record the
    dataset's as the run's): another is refused in one line, before any work. None takes the dataset's.
    A phase its build left short (its sources ran dry: data/blocks.py ended it there and began the next) gets the
    steps its blocks are of the split, as the stream gives it, with a warning; a complete build's phases, their
    shares' (`phase_shares`)."""
    from sparknet.data.packed.dataset import PackedDataset
    from sparknet.tokenizer import load_tokenizer, tokenizer_fingerprint

    train = PackedDataset(dataset_dir, "train")
    val = PackedDataset(dataset_dir, "val")
    manifest = train.manifest
    ours = config.to_dict() if config is not None else {}
    if config is not None and (ours["mix"], ours.get("phases")) != (manifest["config"]["mix"],
                                                                    manifest["config"].get("phases")):
        from sparknet.config.identity import describe_changes

        theirs = {key: manifest["config"].get(key) for key in ("mix", "phases")}
        changes = "; ".join(describe_changes(theirs, {"mix": ours["mix"], "phases": ours.get("phases")}))
        raise UserError(f"dataset {dataset_dir} was built from another mix than CONFIG={config.path} ({changes}; it "
                        f"was built from {manifest['config']['path']}): pass that config, or leave CONFIG out to "
                        "train on the dataset's, or build a dataset from this one")
    if config is None:
        log.info("CONFIG not given: the mix is the dataset's, %s", manifest["config"]["path"])
    source = tokenizer_dir or manifest["tokenizer"]["path"]
    tokenizer = load_tokenizer(source)
    if tokenizer_fingerprint(source, tokenizer) != manifest["tokenizer"]["sha256"]:
        raise UserError(f"tokenizer {source} is not the one dataset {train.folder} was built with "
                        f"({manifest['tokenizer']['path']}, sha256 {manifest['tokenizer']['sha256'][:12]}...): "
                        "rebuild the dataset with this tokenizer, or point TOKENIZER_DIR at the original one")
    if len(val) == 0:
        raise UserError(f"dataset {val.folder} has no validation blocks: rebuild it with VAL_TOKENS > 0")
    for split in (train, val):  # the bytes the build wrote (sha256 per chunk), ids within the vocabulary
        split.verify(len(tokenizer))
    phases = manifest["splits"]["train"].get("phases") or []
    return PackedPlan(
        phases=phase_shares(phases, train.folder),
        train=train,
        val=val,
        val_tokens=np.asarray(val.tokens),
        block_size=train.block_size,
        tokenizer=tokenizer,
        tokenizer_source=source,
        target_tokens=manifest["config"]["target_tokens"],
        identity={"dataset_dir": dataset_dir, "dataset_inputs": manifest.get("inputs")},
        manifest_metadata={
            "config": manifest["config"],
            "source_revisions": manifest.get("source_revisions", {}),
            "text_columns": manifest.get("text_columns", {}),
            "dataset": {"path": str(train.folder), "inputs": manifest.get("inputs"),
                        "realised_mixture": {k: v["sources"] for k, v in manifest["splits"].items()}},
        },
        train_blocks=len(train),
        val_sources=val.source_ids,
        source_labels=val.source_labels,
    )


def phase_shares(phases: list[dict[str, Any]], folder: Path) -> tuple[tuple[str, float], ...]:
    """Each phase's name and share of the run's steps: its share asked where the build wrote every phase whole, else
    the share of the split's blocks it holds, so that a short phase's steps train its blocks as often as the rest's
    (as the stream, which begins the next phase where the short one ran dry) instead of repeating a few of them."""
    if all(phase["complete"] for phase in phases):
        return tuple((phase["name"], float(phase["run_share"])) for phase in phases)
    total = sum(end - start for phase in phases for start, end in [phase["blocks"]])
    for phase in phases:
        if not phase["complete"]:
            log.warning("phase %s of dataset %s is short: its build wrote %d blocks for it (%.1f%% of the split, asked "
                        "%.1f%%)%s; each phase's steps follow the blocks it holds", phase["name"], folder,
                        phase["blocks"][1] - phase["blocks"][0],
                        100 * (phase["blocks"][1] - phase["blocks"][0]) / max(total, 1), 100 * phase["run_share"],
                        f", missing its mix ({', '.join(phase['shares_missed'])})" if phase["shares_missed"] else "")
    return tuple((phase["name"], (phase["blocks"][1] - phase["blocks"][0]) / max(total, 1)) for phase in phases)


class BlockDataset:
    """Blocks held in memory (the stream's validation split) as a torch Dataset of {"input_ids", "labels"}."""

    def __init__(self, tokens: np.ndarray) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        ids = torch.from_numpy(self.tokens[index].astype(np.int64))
        return {"input_ids": ids, "labels": ids}


class SourcedBlocks:
    """Validation blocks with, in each item, the source of each token ("source_ids") and the block's index
    ("block_index"): SparkTrainer sums the eval loss per source from them, exactly once per block even when data
    parallelism evaluates a block twice (it pads the last batches)."""

    def __init__(self, blocks: Any, sources: np.ndarray) -> None:
        if len(sources) != len(blocks):
            raise ValueError(f"{len(sources)} rows of source ids for {len(blocks)} validation blocks")
        self.blocks, self.sources = blocks, sources

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        return {**self.blocks[index], "source_ids": torch.from_numpy(self.sources[index].astype(np.int64)),
                "block_index": index}
