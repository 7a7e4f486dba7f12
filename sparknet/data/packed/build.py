"""Building a packed dataset: stream every source, encode in worker processes, mix by tokens, pack, write.

Each source is read lazily and encoded in batches on a process pool, with a bounded number of batches in flight per
source, so memory does not grow with the dataset. The mixer then takes whole documents from the source furthest
behind its token share. The first VAL_TOKENS (whole blocks) of the mixed stream form the validation split, the
rest the training split; a document goes entirely to one of them. Output order depends only on the inputs, never on
the number of workers, so the same inputs give byte-identical token files.

A config in phases ("phases") has its training split written phase after phase: phase k's blocks are the range
`config.phase_ends(train blocks)` gives it, mixed by its probs from its first block on (the document that crosses a
boundary ends in the next phase's first block); the manifest records each phase's block range and realised shares
(`splits.train.phases`), with its own `complete` and `shares_missed`, and the trainer draws each phase's steps
from that range only. The validation split is mixed by the run-wide mix.

Sources are read with the streaming trainer's reader (`SourceReader`: its seeded shuffle buffer is part of its
position) and encoded ahead with its `EncodedDocuments`. A build writes into a hidden sibling folder and renames it
to OUTPUT_DIR only once the manifest is in it. Every CHECKPOINT_SECONDS it saves its position there
(`packed/resume.py`): an interrupted build of the same inputs goes on from the last save and writes the same bytes.
"""

from __future__ import annotations

import logging
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sparknet.checks import check_values
from sparknet.config import MixConfig
from sparknet.data.encoding.packer import (
    BlockPacker,
    token_dtype,
    val_document_caps,
)
from sparknet.data.packed.dataset import (
    FORMAT_VERSION,
    MANIFEST,
    SPLITS,
    VAL_SOURCES,
    SplitWriter,
    read_manifest,
    split_damage,
    split_size_problem,
    write_source_ids,
)
from sparknet.data.packed.manifest import description, missed_shares, phase_report, split_report
from sparknet.data.packed.resume import STATE, load_state, restore_packers, save_state
from sparknet.data.pieces import PIECE_BLOCKS, piece_tokens_for
from sparknet.data.pipeline import DocumentCaps, Encoders, Pipeline, stop
from sparknet.data.source.opening import at_commits, resolve_revisions
from sparknet.errors import UserError
from sparknet.identity import describe_changes, local_files_fingerprint
from sparknet.locks import exclusive
from sparknet.runtime import replace_folder, write_json_atomic, writes_to
from sparknet.tokenizer import tokenizer_fingerprint

log = logging.getLogger(__name__)
_FLUSH_TOKENS = BlockPacker.flush_tokens  # how many pending tokens the packer hands out in blocks at once

# The rules that decide which document goes where, part of a dataset's inputs: a dataset built by other rules is
# other data.
MIXING_RULES = ("midpoint key; validation documents capped per source for 20 each; training documents over "
                f"{PIECE_BLOCKS} blocks mixed in pieces; validation documents never repeated in training")



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
    shuffle_buffer: int = 0
    fail_on_exhausted: bool = False
    overwrite: bool = False
    batch_docs: int = 256
    batch_chars: int = 1 << 20
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
    """The existing manifest when OUTPUT_DIR already holds this very dataset, whole; None when it is to be (re)built;
    errors for anything the user must decide. With OVERWRITE a damaged or other dataset is replaced, but a folder
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
        dataset_files = {MANIFEST, VAL_SOURCES, *(f"{s}.bin" for s in SPLITS)}
        only_dataset_files = all(p.name in dataset_files for p in out.iterdir())
        if spec.overwrite and only_dataset_files:
            return None  # a damaged dataset: rebuilt in place
        if unreadable is not None:
            raise unreadable from None
        raise UserError(
            f"{out} exists but holds no dataset (no {MANIFEST}): move it away or choose another OUTPUT_DIR"
        )
    if manifest["inputs"] != inputs:
        if spec.overwrite:
            return None
        changes = "; ".join(describe_changes(manifest["inputs"], inputs))
        raise UserError(
            f"{out} already holds a dataset built from other inputs ({changes}). Choose another "
            "OUTPUT_DIR, or pass --overwrite true to replace it"
        )
    damage = _damage(out, manifest)
    if damage is None:
        return manifest
    if spec.overwrite:
        return None
    raise UserError(f"{out} holds this dataset but it is damaged ({damage}): pass --overwrite true to rebuild it")


def build_dataset(spec: BuildSpec) -> dict[str, Any]:
    """Builds (or finds already built, or resumes) the dataset described by `spec`; returns its manifest."""
    from sparknet.tokenizer import check_source_tokenizers, load_tokenizer

    started = time.time()
    tok = load_tokenizer(spec.tokenizer)
    check_source_tokenizers(spec.config, spec.tokenizer, tok)
    if spec.val_tokens is None:  # the default scales to the sources, said in one line after the quick checks
        from sparknet.data.scaled_defaults import BUILD_VAL_TOKENS, default_val_tokens

        spec.val_tokens = default_val_tokens(spec.config, BUILD_VAL_TOKENS)
    _check_spec(spec)
    trained_for = _trained_context(spec, tok)
    dtype = token_dtype(len(tok), spec.dtype)
    inputs = _inputs(spec, tok, dtype)
    writes_to(spec.output_dir.parent)
    with exclusive(spec.output_dir, "a dataset build"):  # a second build at once would write the same files
        existing = _check_existing(spec, inputs)
        if existing is not None:
            log.info("%s already holds this dataset (same inputs): nothing to do", spec.output_dir)
            return existing
        tmp = spec.output_dir.with_name(f".{spec.output_dir.name}.building")
        state = _resume_point(tmp, inputs, spec.block_size * dtype.itemsize)
        # read at the commit recorded in the manifest (a resumed build at its first run's), even if a branch moves
        commits = state["commits"] if state is not None else resolve_revisions(spec.config)
        manifest = _build(spec, tok, dtype, tmp, {"inputs": inputs, "commits": commits}, state)
        manifest.update(description(spec, tok, dtype, inputs, commits, trained_for))
        manifest["build_seconds"] = round(time.time() - started, 2)
        write_json_atomic(tmp / MANIFEST, manifest)
        # what is published is what the manifest says, byte for byte in size (its hashes were taken as it wrote)
        damage = _damage(tmp, manifest, contents=False)
        if damage is not None:
            raise UserError(f"the build's own files do not match its manifest ({damage}): something else wrote into "
                            f"{tmp} (or the disk is full); run the same command again")
        replace_folder(tmp, spec.output_dir)
        return manifest


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
    }
    inputs["mixing"] = MIXING_RULES
    return inputs


def _resume_point(tmp: Path, inputs: dict[str, Any], block_bytes: int) -> dict[str, Any] | None:
    """The saved position of an interrupted build of these inputs in `tmp` (then kept), else None (`tmp` emptied)."""
    state = load_state(tmp, inputs, block_bytes) if tmp.exists() else None
    if tmp.exists() and state is None:
        shutil.rmtree(tmp)
    if state is not None:
        done = sum(state["written"].values()) * int(inputs["block_size"])
        log.info("resuming the interrupted build in %s after %s tokens", tmp, f"{done:,}")
    tmp.mkdir(parents=True, exist_ok=True)
    return state


def _build(spec: BuildSpec, tok: Any, dtype: np.dtype, tmp: Path, saved: dict[str, Any],
           state: dict[str, Any] | None) -> dict[str, Any]:
    """Encodes, mixes and packs into `tmp` (from `state` when resuming); returns the split part of the manifest.
    Whatever stops it, the encoders and readers are stopped, and `tmp` is kept only if it holds a saved position."""
    encoders = pipeline = None
    try:
        encoders = Encoders(spec.num_workers, tok.backend_tokenizer.to_str(), int(tok.eos_token_id), dtype)
        caps = DocumentCaps(_val_caps(spec), active=state is None or state["split"] == "val",
                            documents_cut=state["val_cut"] if state is not None else None)
        # read at the resolved commits (from the saved position when resuming)
        pipeline = Pipeline(at_commits(spec.config, saved["commits"]), encoders, state=state, seed=spec.seed,
                            shuffle_buffer=spec.shuffle_buffer, caps=caps, in_flight=max(2, 2 * spec.num_workers),
                            batch_docs=spec.batch_docs, batch_chars=spec.batch_chars, read_ahead=spec.read_ahead,
                            piece_tokens=piece_tokens_for(spec.block_size))
        manifest = _pack(spec, pipeline, tmp, dtype, saved, state)
    except BaseException:
        stop(pipeline.sources if pipeline is not None else {}, encoders, clean=False)
        # kept whenever a position was saved, a UserError included: a Hub source that failed after the retries of
        # `datasets` is the very case a resume is for (a build of other inputs starts over anyway)
        if not (tmp / STATE).is_file():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log.warning("build stopped: the same command resumes it from its last saved position (%s)", tmp)
        raise
    assert pipeline is not None
    stop(pipeline.sources, encoders, clean=True)
    for leftover in (tmp / STATE, tmp / f".{STATE}.tmp"):  # the latter from a kill during a save
        leftover.unlink(missing_ok=True)
    return manifest


def _val_caps(spec: BuildSpec) -> dict[str, int]:
    return val_document_caps({s.label: s.prob for s in spec.config.mix}, spec.val_tokens)


def _pack(spec: BuildSpec, pipeline: Pipeline, folder: Path, dtype: np.dtype, saved: dict[str, Any],
          state: dict[str, Any] | None) -> dict[str, Any]:
    """Runs the mixed documents through the val then the train packer, saving the position (with `saved`: the
    inputs and the commits read) every CHECKPOINT_SECONDS; returns the split part of the manifest."""
    from sparknet.progress import progress

    block = spec.block_size
    want = {"val": math.ceil(spec.val_tokens / block), "train": spec.target_tokens // block}
    packers = {split: BlockPacker(block, dtype, max_blocks=want[split]) for split in SPLITS}
    labels = [source.label for source in spec.config.mix]
    packers["val"].record_sources(labels)  # each validation token's source, for the loss per source
    restore_packers(packers, state)
    written = state["written"] if state is not None else {}
    writers = {split: SplitWriter(folder, split, block, dtype, blocks=written.get(split, 0)) for split in SPLITS}
    bar = progress(total=(want["val"] + want["train"]) * block, unit="tok", unit_scale=True, desc="packing",
                   smoothing=0.1, initial=sum(p.tokens_added for p in packers.values()))
    split = state["split"] if state is not None else "val"
    mixer = pipeline.mixer
    phases = _PhaseSwitch(spec.config.phase_ends(want["train"]), state)
    if spec.config.phased:  # blocks handed out only up to a boundary, so that each phase's tokens count to it
        packers["train"].flush_tokens = sys.maxsize
    saved_at, interval = time.monotonic(), spec.checkpoint_seconds
    try:
        for label, doc in pipeline:
            packer = packers[split]
            full = packer.add(label, doc)
            if full is not None:
                writers[split].write(full)
            if split == "train" and spec.config.phased:
                phases.after_document(pipeline, packer, writers["train"])
            bar.update(len(doc))
            if packer.full:
                writers[split].write(packer.finish())
                if split == "train":
                    break
                split = "train"
                pipeline.end_hold_out()
            elif spec.fail_on_exhausted and any(c.exhausted for c in mixer.counts.values()):
                dry = ", ".join(name for name, c in mixer.counts.items() if c.exhausted)  # stop now, not hours later
                raise UserError(f"source(s) {dry} ran dry before reaching their share (FAIL_ON_EXHAUSTED is on)")
            if spec.checkpoint_seconds and time.monotonic() - saved_at >= interval:
                began = time.monotonic()
                save_state(folder, saved=saved, split=split, pipeline=pipeline, packers=packers, writers=writers,
                           phase_tokens=phases.tokens)
                saved_at = time.monotonic()
                # large shuffle buffers make a save slow: saving never takes more than a tenth of the build
                interval = max(spec.checkpoint_seconds, 10 * (saved_at - began))
        else:  # every source ran dry before the budget
            for name in SPLITS:
                writers[name].write(packers[name].finish())
    finally:
        bar.close()
        for w in writers.values():
            w.close()

    cut = {s.label: pipeline.caps.documents_cut[s.label] for s in spec.config.mix}
    splits = split_report(spec, mixer, packers, writers, cut, _val_caps(spec), pipeline.removed())
    splits["val"]["source_ids"] = write_source_ids(folder, packers["val"].source_ids(), labels, block)
    exhausted = [label for label, c in mixer.counts.items() if c.exhausted]
    if writers["train"].blocks == 0:
        caps = pipeline.caps.caps
        read = ", ".join(f"{label} {c.documents} document(s)" + (f", {cut[label]} cut at the validation cap of "
                                                                   f"{caps[label]:,} tokens" if cut.get(label) else "")
                         for label, c in mixer.counts.items())
        raise UserError(
            f"the sources hold too few tokens for even one training block of {block} tokens after "
            f"{writers['val'].blocks} validation blocks (read: {read}; the rest of a validation document longer "
            "than its cap is dropped, never trained on): add data, or lower VAL_TOKENS or BLOCK_SIZE"
        )
    short = writers["train"].blocks < want["train"] or writers["val"].blocks < want["val"]
    if exhausted:
        message = f"source(s) {', '.join(exhausted)} ran dry before reaching their share" + (
            "; the dataset is smaller than asked" if short else "; the other sources filled the gap"
        )
        if spec.fail_on_exhausted:
            raise UserError(message + " (FAIL_ON_EXHAUSTED is on)")
        log.warning(message)
    if spec.config.phased:
        splits["train"]["phases"] = phase_report(spec, phases.tokens, packers["train"], writers["train"].blocks)
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


class _PhaseSwitch:
    """Where the training split's phases end (in blocks) and each source's training tokens at every boundary passed
    (saved with the build's position): after each document, once the tokens packed reach the phase's last block, its
    blocks are written up to there, the counts noted and the next phase started."""

    def __init__(self, ends: list[int], state: dict[str, Any] | None) -> None:
        self.ends = ends
        self.tokens: list[dict[str, int]] = list((state or {}).get("phase_tokens", []))

    def after_document(self, pipeline: Pipeline, packer: BlockPacker, writer: SplitWriter) -> None:
        block = packer.block_size
        while pipeline.phase + 1 < len(self.ends) and packer.tokens_added >= self.ends[pipeline.phase] * block:
            writer.write(packer.take(self.ends[pipeline.phase] - packer.blocks))
            self.tokens.append(dict(packer.tokens_by_source))
            pipeline.start_phase(pipeline.phase + 1)
        if packer.pending_tokens >= _FLUSH_TOKENS:  # the packer's own flush, held back at the boundary
            writer.write(packer.take(packer.pending_tokens // block))
