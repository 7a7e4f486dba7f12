"""Building a packed dataset: the stream at one process, its blocks written to the split files.

The build runs the streaming trainer's data path (data/holdout.py, data/pipeline.py, data/blocks.py) at rank 0 of 1:
the validation hold-out's blocks go to val.bin (and each token's source to val_sources.bin), then the training
part's blocks, in the stream's order, to train.bin, until TARGET_TOKENS (whole blocks). So a streaming run on one
process with the same config, tokenizer, VAL_TOKENS, SHUFFLE_BUFFER and seed holds out exactly val.bin's blocks and
trains on train.bin's (README, "What is guaranteed"). Output order depends only on the inputs, never on the number
of workers, so the same inputs give byte-identical token files.

A config in phases has its training split written phase after phase: phase k's blocks are the range
`config.phase_ends(train blocks)` gives it (the stream's switch, data/blocks.py); the manifest records each phase's
block range and realised shares (`splits.train.phases`), with its own `complete` and `shares_missed`, and the trainer
draws each phase's steps from that range only. The validation split is mixed by the run-wide mix.

A build writes into a hidden sibling folder (`.NAME.building`) and puts it at OUTPUT_DIR only once the manifest is
in it. Every CHECKPOINT_SECONDS of training blocks it saves its position there (POSITION: the stream's position, the
stream's format, with what the hold-out left to training): an interrupted build of the same inputs goes on from the
last save and writes the same bytes (one interrupted while holding out starts over: the hold-out is small). The
dataset keeps the position after its last block, its sha256 in the manifest, so that a build of the same inputs with
a larger TARGET_TOKENS appends to it (`grow`) and gives the bytes a fresh build of that size gives.

A growth never touches the complete dataset: it copies the files into the hidden folder, appends there, and the
grown dataset takes OUTPUT_DIR's place in one atomic step (runtime.replace_folder). Until then trainers and
evaluations read the complete one, unchanged; a growth that fails, is interrupted or is refused leaves it as it was,
and only OVERWRITE replaces a complete dataset with another.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sparknet.common.errors import UserError
from sparknet.common.locks import exclusive
from sparknet.common.runtime import replace_folder, write_json_atomic, writes_to
from sparknet.config.checks import check_values
from sparknet.config.identity import describe_changes, local_files_fingerprint
from sparknet.config.mix import MixConfig
from sparknet.data.blocks import StreamBlocks, initial_state
from sparknet.data.holdout import HeldOut, hold_out
from sparknet.data.packed.dataset import (
    FORMAT_VERSION,
    MANIFEST,
    POSITION,
    SPLITS,
    VAL_SOURCES,
    SplitWriter,
    read_manifest,
    sealed,
    split_damage,
    split_size_problem,
    write_source_ids,
)
from sparknet.data.packed.manifest import description, missed_shares, phase_report, split_report
from sparknet.data.pipeline import Encoders, Pipeline, stop
from sparknet.data.source.opening import at_commits, resolve_revisions
from sparknet.data.spec import PIECE_BLOCKS, DataSpec, HeldOutRows, Part, data_rule, token_dtype
from sparknet.tokenizer import tokenizer_fingerprint

log = logging.getLogger(__name__)
POSITION_FORMAT = 3  # of POSITION (the build's saved position; 3: the hold-out's report has its item starts)
WRITE_BLOCKS = 256  # blocks gathered before a write to train.bin

# The rules that decide which document goes where, part of a dataset's inputs: a dataset built by other rules is
# other data.
MIXING_RULES = ("midpoint key; the hold-out first, each document at most its source's cap for 20 each, the rest "
                f"training's; documents in pieces of {PIECE_BLOCKS} blocks ended with a block; validation documents "
                "never repeated in training")


@dataclass
class BuildSpec:
    """Everything a build depends on (the script's constants, resolved)."""

    config: MixConfig
    tokenizer: str
    output_dir: Path
    target_tokens: int
    val_tokens: int | None  # None: scaled to the sources (data/scaled_defaults.py)
    block_size: int
    seed: int
    num_workers: int = 0
    dtype: str = "auto"
    shuffle_buffer: int | None = 0  # None: scaled to the sources (data/scaled_defaults.py)
    on_exhausted: str = "renormalise"  # ON_EXHAUSTED: the stream's rule for a source that runs dry
    overwrite: bool = False
    checkpoint_seconds: float = 60.0  # how often the position is saved for a resume (0: never)
    # batches each source reads ahead on its own thread (0: read when the encoders need it; None: 8 for a source read
    # from the Hub, whose network waits release the GIL, 0 for local files: one reading thread feeds ~75 encoders
    # and reading ahead was within noise on 2 cores, 0.67-1.11x in bench/pack_throughput.py)
    read_ahead: int | None = None


def _damage(folder: Path, manifest: dict[str, Any], contents: bool = True) -> str | None:
    """What is wrong with the token files of a dataset (its manifest read by read_manifest), None when they are
    whole: every split's file at exactly `blocks × block_size × itemsize` bytes, and, with `contents`, each chunk's
    sha256 the manifest's (under 1.5 s per GB; the sizes of every file are checked first)."""
    for split in SPLITS:
        problem = split_size_problem(folder, manifest, split)
        if problem is not None:
            return problem
    for split in SPLITS if contents else ():
        problem = split_damage(folder, manifest, split)
        if problem is not None:
            return problem
    return None


def _check_existing(spec: BuildSpec, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The existing manifest when OUTPUT_DIR already holds this very dataset, whole, or a smaller one that this
    build grows (`_growable`, its position checked); None when it is to be (re)built; errors for anything the user
    must decide. With OVERWRITE a damaged or other dataset is replaced (once the new one is complete), but a folder
    holding anything other than dataset files never is."""
    out = spec.output_dir
    if not out.exists():
        return None
    if not out.is_dir():
        raise UserError(f"OUTPUT_DIR {out} is a file, not a folder: choose another OUTPUT_DIR")
    try:
        manifest = read_manifest(out)
        unreadable = None
    except UserError as exc:  # unreadable, of the wrong shape or of another format: it names the file and the fix
        manifest, unreadable = None, exc
    if manifest is None:
        if unreadable is None and not any(out.iterdir()):
            return None
        dataset_files = {MANIFEST, VAL_SOURCES, POSITION, *(f"{s}.bin" for s in SPLITS)}
        only_dataset_files = all(p.name in dataset_files for p in out.iterdir())
        if spec.overwrite and only_dataset_files:
            return None  # a damaged dataset: rebuilt beside it, then put in its place
        if unreadable is not None:
            raise unreadable from None
        raise UserError(
            f"{out} exists but holds no dataset (no {MANIFEST}): move it away or choose another OUTPUT_DIR"
        )
    growable = _growable(manifest, inputs)
    if manifest["inputs"] != inputs and not growable:
        if spec.overwrite:
            return None
        raise UserError(f"{out} already holds {_why_not_this_dataset(manifest, inputs)}")
    damage = _damage(out, manifest)
    if damage is not None:
        if spec.overwrite:
            return None
        raise UserError(f"{out} holds this dataset but it is damaged ({damage}): pass --overwrite true to rebuild it")
    if growable:
        _check_position(out, manifest)
    return manifest


def _why_not_this_dataset(manifest: dict[str, Any], inputs: dict[str, Any]) -> str:
    """Why the dataset of `manifest` is neither this build's nor one it grows, and what keeps it: the end of a
    sentence that starts with the folder's name."""
    old = manifest["inputs"]
    bigger = {**old, "target_tokens": inputs["target_tokens"]} == inputs and inputs["target_tokens"] > old[
        "target_tokens"]
    elsewhere = "build the larger size in another OUTPUT_DIR (this dataset is kept), or pass --overwrite true to " \
                "replace it"
    if bigger and "phases" in inputs:
        return (f"this dataset in phases at {old['target_tokens']:,} training tokens, and a dataset in phases cannot "
                f"grow (each phase's blocks follow the size): {elsewhere}")
    if bigger:
        return (f"this dataset at {old['target_tokens']:,} training tokens, but it is not complete (a source ran dry "
                f"or its mix missed the shares: see its {MANIFEST}), so it cannot grow: {elsewhere}")
    changes = "; ".join(describe_changes(old, inputs))
    return (f"a dataset built from other inputs ({changes}). Choose another OUTPUT_DIR, or pass --overwrite true to "
            "replace it")


def _growable(manifest: dict[str, Any], inputs: dict[str, Any]) -> bool:
    """Whether the dataset of `manifest` grows into one of `inputs`: the same inputs but a larger TARGET_TOKENS, built
    whole, in one phase (phases' blocks follow the size). Its position is checked apart (`_check_position`)."""
    old = manifest["inputs"]
    return ({**old, "target_tokens": inputs["target_tokens"]} == inputs
            and inputs["target_tokens"] > old["target_tokens"] and "phases" not in inputs
            and bool(manifest.get("complete")))


def _check_position(folder: Path, manifest: dict[str, Any]) -> None:
    """The position a growth goes on from is the one the build kept: present, and of the sha256 its manifest
    records. Anything else is one line naming the file, before any work, with advice that keeps the dataset."""
    path = folder / POSITION
    keep = ("build the larger size in another OUTPUT_DIR (this dataset is kept and stays usable as it is), or "
            "pass --overwrite true to rebuild it at the larger size")
    if not path.is_file():
        raise UserError(f"{path} is missing, so the dataset in {folder} cannot grow from where it ended: {keep}")
    if hashlib.sha256(path.read_bytes()).hexdigest() != manifest["position_sha256"]:
        raise UserError(f"{path} is damaged (its sha256 is not the one its {MANIFEST} records), so the dataset "
                        f"cannot grow from it: {keep}")


def build_dataset(spec: BuildSpec) -> dict[str, Any]:
    """Builds (or finds already built, grows, or resumes) the dataset described by `spec`; returns its manifest."""
    from sparknet.tokenizer import check_source_tokenizers, load_tokenizer

    started = time.time()
    tok = load_tokenizer(spec.tokenizer)
    check_source_tokenizers(spec.config, spec.tokenizer, tok)
    # the defaults scale to the sources and the config (the stream's rule), said in one line after the quick checks
    from sparknet.data.scaled_defaults import default_shuffle_buffer, default_val_tokens

    if spec.shuffle_buffer is None:
        spec.shuffle_buffer = default_shuffle_buffer(spec.config)
    if spec.val_tokens is None:
        spec.val_tokens = default_val_tokens(spec.config, spec.target_tokens)
    _check_spec(spec)
    trained_for = _trained_context(spec, tok)
    dtype = token_dtype(len(tok), spec.dtype)
    inputs = _inputs(spec, tok, dtype)
    writes_to(spec.output_dir.parent)
    with exclusive(spec.output_dir, "a dataset build"):  # a second build at once would write the same files
        tmp = spec.output_dir.with_name(f".{spec.output_dir.name}.building")
        try:
            existing = _check_existing(spec, inputs)
        except UserError as exc:
            raise UserError(f"{exc}{_left_in(tmp, spec)}") from None
        if existing is not None and existing["inputs"] == inputs:
            log.info("%s already holds this dataset (same inputs): nothing to do%s", spec.output_dir,
                     _left_in(tmp, spec))
            return existing
        block_bytes = spec.block_size * dtype.itemsize
        if existing is not None:
            _start_growing(spec, existing, inputs, tmp, block_bytes)
        state = _resume_point(tmp, inputs, block_bytes)
        # read at the commit recorded in the manifest (a resumed build at its first run's), even if a branch moves
        commits = state["commits"] if state is not None else resolve_revisions(spec.config)
        data = DataSpec(config=at_commits(spec.config, commits), tokenizer_json=tok.backend_tokenizer.to_str(),
                        eos_id=int(tok.eos_token_id), block_size=spec.block_size, seed=spec.seed,
                        val_tokens=spec.val_tokens, shuffle_buffer=spec.shuffle_buffer, num_workers=spec.num_workers,
                        read_ahead=spec.read_ahead,
                        dtype=spec.dtype)
        try:
            manifest = _build(spec, data, tmp, {"format": POSITION_FORMAT, "inputs": inputs, "commits": commits},
                              state)
        except BaseException:
            if existing is not None:
                log.warning("the complete %s-token dataset in %s is unchanged",
                            f"{existing['inputs']['target_tokens']:,}", spec.output_dir)
            raise
        manifest.update(description(spec, tok, dtype, inputs, commits, trained_for))
        manifest["position_sha256"] = hashlib.sha256((tmp / POSITION).read_bytes()).hexdigest()  # what a growth reads
        manifest["build_seconds"] = round(time.time() - started, 2)
        manifest = sealed(manifest)
        write_json_atomic(tmp / MANIFEST, manifest)
        # what is published is what the manifest says, byte for byte in size (its hashes were taken as it wrote)
        damage = _damage(tmp, manifest, contents=False)
        if damage is not None:
            raise UserError(f"the build's own files do not match its manifest ({damage}): something else wrote into "
                            f"{tmp} (or the disk is full); run the same command again")
        replace_folder(tmp, spec.output_dir)  # one atomic step: the complete dataset or the new one, never none
        return manifest


def _left_in(tmp: Path, spec: BuildSpec) -> str:
    """What a command that neither resumes nor discards an interrupted build in `tmp` says of it (its end of line)."""
    state = _read_state(tmp)
    if state is None:
        return ""
    target = (state.get("inputs") or {}).get("target_tokens")
    what = f"to {target:,} training tokens " if isinstance(target, int) else ""
    return (f" (an interrupted build {what}is kept in {tmp}: the command that started it resumes it; delete the "
            "folder to drop it)")


def _start_growing(spec: BuildSpec, manifest: dict[str, Any], inputs: dict[str, Any], tmp: Path,
                   block_bytes: int) -> None:
    """Makes `tmp` an interrupted build of `inputs` stopped after the last block of the complete dataset in
    OUTPUT_DIR: its files copied (the dataset itself is never written to), its position the saved one, so that an
    interruption from here on resumes as any build does. An interrupted growth of these very inputs is left to
    resume; one of other inputs is discarded, and said."""
    grown_from = f"{manifest['inputs']['target_tokens']:,}"
    state, why = _saved_state(tmp, inputs, block_bytes) if tmp.exists() else (None, None)
    if state is not None:
        log.info("%s holds this dataset at %s training tokens: resuming its growth to %s", spec.output_dir,
                 grown_from, f"{inputs['target_tokens']:,}")
        return
    if tmp.exists():
        log.warning("discarded %s: %s; the complete dataset in %s is kept and grows from its end", tmp, why,
                    spec.output_dir)
        shutil.rmtree(tmp)
    log.info("%s holds this dataset at %s training tokens: growing it to %s beside it (it stays as it is until the "
             "grown one replaces it)", spec.output_dir, grown_from, f"{inputs['target_tokens']:,}")
    tmp.mkdir()
    for name in (*(f"{split}.bin" for split in SPLITS), VAL_SOURCES):
        shutil.copyfile(spec.output_dir / name, tmp / name)
    position = json.loads((spec.output_dir / POSITION).read_text())  # its sha256 checked (_check_position)
    write_json_atomic(tmp / POSITION, {**position, "inputs": inputs}, compact=True)  # last: a resumable build now


def _check_spec(spec: BuildSpec) -> None:
    config = spec.config
    check_values({"BLOCK_SIZE": spec.block_size, "VAL_TOKENS": spec.val_tokens})
    if spec.block_size > config.context_length:
        raise UserError(
            f"BLOCK_SIZE={spec.block_size} exceeds the model's context of {config.context_length} "
            f"tokens ({config.path}: context_length): lower BLOCK_SIZE"
        )
    if spec.target_tokens < spec.block_size:
        raise UserError(f"TARGET_TOKENS={spec.target_tokens} is less than one block of {spec.block_size} tokens")


def _trained_context(spec: BuildSpec, tok: Any) -> int | None:
    """The context the tokenizer was trained for, if it records one. It does not limit the context (the model's is
    the config's), so a longer BLOCK_SIZE is fine; it is noted in the manifest."""
    max_len = getattr(tok, "model_max_length", None)
    trained_for = max_len if isinstance(max_len, int) and max_len < 10**8 else None
    if trained_for is not None and spec.block_size > trained_for:
        log.info("tokenizer %s was trained for %d-token contexts; packing %d-token blocks (a tokenizer does not "
                 "limit the context)", spec.tokenizer, trained_for, spec.block_size)
    return trained_for


def _inputs(spec: BuildSpec, tok: Any, dtype: np.dtype) -> dict[str, Any]:
    """Everything the token files depend on: the same inputs give the same bytes."""
    inputs = {
        "format_version": FORMAT_VERSION,
        "tokenizer_sha256": tokenizer_fingerprint(spec.tokenizer, tok),
        "mix": spec.config.to_dict()["mix"],
        **({"phases": spec.config.to_dict()["phases"]} if spec.config.phased else {}),
        "local_files_sha256": local_files_fingerprint(spec.config),
        "seed": spec.seed,
        "block_size": spec.block_size,
        "dtype": dtype.name,
        "target_tokens": spec.target_tokens,
        "val_tokens": spec.val_tokens,
        "shuffle_buffer": spec.shuffle_buffer,
        "on_exhausted": data_rule(spec.on_exhausted),
    }
    inputs["mixing"] = MIXING_RULES
    return inputs


def _resume_point(tmp: Path, inputs: dict[str, Any], block_bytes: int) -> dict[str, Any] | None:
    """The saved position of an interrupted build of these inputs in `tmp` (then kept), else None (`tmp` emptied:
    it never holds a complete dataset, which lives at OUTPUT_DIR)."""
    state, why = _saved_state(tmp, inputs, block_bytes) if tmp.exists() else (None, None)
    if tmp.exists() and state is None:
        log.warning("found an interrupted build in %s %s: starting over", tmp, why)
        shutil.rmtree(tmp)
    if state is not None:
        done = sum(state["written"].values()) * int(inputs["block_size"])
        log.info("resuming the interrupted build in %s after %s tokens", tmp, f"{done:,}")
    tmp.mkdir(parents=True, exist_ok=True)
    return state


def _read_state(folder: Path) -> dict[str, Any] | None:
    """The saved position in `folder` as an object, or None (no file, unreadable, not an object)."""
    try:
        state = json.loads((folder / POSITION).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return state if isinstance(state, dict) else None


def _saved_state(folder: Path, inputs: dict[str, Any], block_bytes: int) -> tuple[dict[str, Any] | None, str]:
    """The saved position of an interrupted build of these very inputs in `folder`, or None and why not (the end
    of a sentence about the folder)."""
    path = folder / POSITION
    if not path.is_file():
        return None, "that saved no position"
    state = _read_state(folder)
    if state is None:
        return None, "with an unreadable position"
    if state.get("format") != POSITION_FORMAT or state.get("inputs") != inputs:
        changes = "; ".join(describe_changes(state.get("inputs") or {}, inputs)) or "another format"
        return None, f"of other inputs ({changes})"
    for name, blocks in state["written"].items():
        file = folder / f"{name}.bin"
        if not file.is_file() or file.stat().st_size < blocks * block_bytes:
            return None, f"whose {file.name} is shorter than its position"
    return state, ""


class _Writing:
    """The training blocks on their way to train.bin: gathered, written WRITE_BLOCKS at a time, and the position
    after the last block saved with the build's state every CHECKPOINT_SECONDS (and at the end, where it stays:
    POSITION)."""

    def __init__(self, folder: Path, saved: dict[str, Any], writers: dict[str, SplitWriter], interval: float) -> None:
        self.folder, self.saved, self.writers = folder, saved, writers
        self.pending: list[np.ndarray] = []
        self.interval = interval
        self.saved_at = time.monotonic()

    def add(self, block: np.ndarray, loop: StreamBlocks) -> None:
        self.pending.append(block)
        if len(self.pending) >= WRITE_BLOCKS:
            self.flush()
        if self.interval and time.monotonic() - self.saved_at >= self.interval:
            began = time.monotonic()
            self.save(loop)
            self.saved_at = time.monotonic()
            # large shuffle buffers make a save slow: saving never takes more than a tenth of the build
            self.interval = max(self.interval, 10 * (self.saved_at - began))

    def flush(self) -> None:
        if self.pending:
            self.writers["train"].write(np.stack(self.pending))
            self.pending = []

    def save(self, loop: StreamBlocks) -> None:
        """The position after the blocks given, once the files hold them (whenever the process dies after)."""
        self.flush()
        for writer in self.writers.values():
            writer.sync()
        self.saved["position"] = loop.state_dict()
        self.saved["written"] = {name: writer.blocks for name, writer in self.writers.items()}
        write_json_atomic(self.folder / POSITION, self.saved, compact=True)  # shuffle buffers: no indentation


def _build(spec: BuildSpec, data: DataSpec, tmp: Path, saved: dict[str, Any],
           state: dict[str, Any] | None) -> dict[str, Any]:
    """Holds out the validation blocks into `tmp` (unless resuming after them), then writes the training blocks
    (from `state`'s position when resuming); returns the split part of the manifest. Whatever stops it, the encoders
    and readers are stopped, and `tmp` is kept only if it holds a saved position."""
    from sparknet.common.progress import progress

    want = {"val": math.ceil(data.val_tokens / data.block_size), "train": spec.target_tokens // data.block_size}
    bar = progress(total=(want["val"] + want["train"]) * data.block_size, unit="tok", unit_scale=True,
                   desc="packing", smoothing=0.1, initial=sum((state or {}).get("written", {}).values()) *
                   data.block_size)
    encoders = pipeline = None
    try:
        if state is None:
            saved["held_out"] = _write_hold_out(hold_out(data, progress=bar.update), tmp)
        else:
            saved = state
        held = saved["held_out"]
        part = Part(held_out={label: HeldOutRows.from_dict(rows) for label, rows in held["rows"].items()},
                    exclude=frozenset(held["hashes"]), on_exhausted=spec.on_exhausted,
                    phase_ends=tuple(spec.config.phase_ends(want["train"])) if spec.config.phased else None)
        position = saved.get("position") or initial_state(data.labels, {})
        encoders = Encoders(data)
        pipeline = Pipeline(data, part, encoders, position)
        loop = StreamBlocks(pipeline, position, settings={})
        written = saved.get("written", {"val": held["report"]["blocks"]})
        writers = {split: SplitWriter(tmp, split, data.block_size, data.token_dtype, blocks=written.get(split, 0))
                   for split in SPLITS}
        try:
            phases = _write_training(spec, loop, _Writing(tmp, saved, writers, spec.checkpoint_seconds),
                                     want["train"], bar)
        finally:
            for writer in writers.values():
                writer.close()
    except BaseException:
        bar.close()
        stop(pipeline.sources if pipeline is not None else {}, encoders, clean=False)
        # kept whenever a position was saved, a UserError included: a Hub source that failed after the retries of
        # `datasets` is the very case a resume is for (a build of other inputs starts over anyway)
        if not (tmp / POSITION).is_file():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log.warning("build stopped: the same command resumes it from its last saved position (%s)", tmp)
        raise
    bar.close()
    stop(pipeline.sources, encoders, clean=True)
    (tmp / f".{POSITION}.tmp").unlink(missing_ok=True)  # from a kill during a save
    return _splits(spec, loop, writers, held, phases, want)


def _write_hold_out(held: HeldOut, folder: Path) -> dict[str, Any]:
    """Writes the hold-out's blocks (val.bin) and their tokens' sources (VAL_SOURCES); returns what the training
    part and the manifest need of it (saved with the build's position)."""
    writer = SplitWriter(folder, "val", held.blocks.shape[1], held.blocks.dtype)
    writer.write(held.blocks)
    writer.close()
    return {"rows": {label: rows.to_dict() for label, rows in held.rows.items()}, "hashes": held.hashes,
            "report": held.report,
            "source_ids": write_source_ids(folder, held.source_ids, held.report["source_labels"], held.blocks.shape[1])}


def _write_training(spec: BuildSpec, loop: StreamBlocks, writing: _Writing, want: int,
                    bar: Any) -> tuple[list[dict[str, int]], list[int]]:
    """Writes the training part's blocks until `want` of them (or every source ran dry), saving the position as it
    goes and at the end; returns, for every phase boundary passed (a config in phases), each source's tokens there
    and the block the next phase began at (where planned, or earlier: data/blocks.py, a phase whose sources ran dry)."""
    planned = spec.config.phase_ends(want)[:-1] if spec.config.phased else []
    phase_tokens: list[dict[str, int]] = list(writing.saved.get("phase_tokens", []))
    # a position saved before starts were kept passed only planned boundaries
    phase_starts: list[int] = list(writing.saved.get("phase_starts", planned[:len(phase_tokens)]))
    blocks = loop.blocks()
    while loop.blocks_yielded < want:
        tokens, start = dict(loop.packer.tokens_by_source), loop.blocks_yielded
        block = next(blocks, None)
        if block is None:
            break
        writing.add(block, loop)
        bar.update(spec.block_size)
        while len(phase_tokens) < len(planned):
            k = len(phase_tokens)
            if loop.pipeline.phase > k and start < planned[k]:  # the next phase began early, in this block
                phase_tokens.append(tokens)
                phase_starts.append(start)
            elif loop.blocks_yielded == planned[k]:  # where planned (the mixer switches at the next piece chosen)
                phase_tokens.append(dict(loop.packer.tokens_by_source))
                phase_starts.append(planned[k])
            else:
                break
            writing.saved.update(phase_tokens=phase_tokens, phase_starts=phase_starts)
    writing.save(loop)  # the end of the dataset is a position: a larger build goes on from it
    return phase_tokens, phase_starts


def _splits(spec: BuildSpec, loop: StreamBlocks, writers: dict[str, SplitWriter], held: dict[str, Any],
            phases: tuple[list[dict[str, int]], list[int]], want: dict[str, int]) -> dict[str, Any]:
    """The manifest's account of the splits: their reports (packed/manifest.py), what ran dry, and whether the
    dataset is complete (the size asked and every split's mix)."""
    counts = loop.counts()
    splits = split_report(spec, held, counts, writers)
    exhausted = counts["exhausted"]
    short = writers["train"].blocks < want["train"] or writers["val"].blocks < want["val"]
    if exhausted:
        message = f"source(s) {', '.join(exhausted)} ran dry before reaching their share" + (
            "; the dataset is smaller than asked" if short else "; the other sources filled the gap"
        )
        log.warning(message)
    if spec.config.phased:
        splits["train"]["phases"] = phase_report(spec, *phases, dict(loop.packer.tokens_by_source),
                                                 writers["train"].blocks)
    missed = missed_shares(splits, spec.block_size)
    for phase in splits["train"].get("phases", []):
        for label in phase["shares_missed"]:
            source = phase["sources"][label]
            log.warning("phase %s misses its mix: %s %.1f%% for %.1f%%", phase["name"], label, 100 * source["share"],
                        100 * source["requested_share"])
    for split, labels in missed.items():
        shares = {label: splits[split]["sources"][label] for label in labels}
        log.warning("the %s split misses the mix: %s", split, ", ".join(
            f"{label} {s['share']:.1%} for {s['requested_share']:.1%}" for label, s in shares.items()))
    # "complete": the size asked and every split's mix; never written over a mix that missed its shares
    phases_whole = all(phase["complete"] for phase in splits["train"].get("phases", []))
    return {"splits": splits, "exhausted_sources": exhausted, "complete": not short and not missed and phases_whole,
            "shares_missed": missed, "requested_blocks": want}
