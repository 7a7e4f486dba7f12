"""The streaming trainer's data plan (scripts/train_sparknet.py): validation blocks held out from the start of the
mix, each rank's `TokenStream` after them, its position saved into every checkpoint and restored on resume, and its
realised mix in TensorBoard and the metadata."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from transformers import TrainerCallback

from sparknet.common.errors import UserError
from sparknet.config.mix import MixConfig
from sparknet.data.spec import DataSpec, HeldOutRows, Part, data_rule
from sparknet.run_files import (
    METADATA,
    RUN_CONFIG,
    VAL_BLOCKS,
    VAL_REPORT,
    VAL_SOURCES,
    checkpoints_by_step,
    read_val_blocks,
    read_val_report,
)
from sparknet.train.batch import BatchPlan
from sparknet.train.callbacks import add_described_scalar
from sparknet.train.data_plan import BlockDataset, DataPlan
from sparknet.train.folders import read_identity

log = logging.getLogger("sparknet.train")

STREAM_STATE = "stream_state.rank{rank}.json"


@dataclass
class StreamSpec:
    """The streaming trainer's data constants (scripts/train_sparknet.py), resolved."""

    config: MixConfig
    tokenizer_dir: str
    block_size: int
    val_tokens: int
    seed: int
    shuffle_buffer: int
    on_exhausted: str
    num_workers: int
    target_tokens: int | None = None  # the run's budget, for the check that each source can give its share
    window_blocks: int = 0  # blocks shuffled together (data/stream/token_stream.py)

    def data(self, tokenizer: Any, commits: dict[str, str | None] | None = None) -> DataSpec:
        """The one description of the data (data/spec.py), its sources read at `commits`."""
        from sparknet.data.source.opening import at_commits

        return DataSpec(config=at_commits(self.config, commits) if commits is not None else self.config,
                        tokenizer_json=tokenizer.backend_tokenizer.to_str(), eos_id=int(tokenizer.eos_token_id),
                        block_size=self.block_size, seed=self.seed, val_tokens=self.val_tokens,
                        shuffle_buffer=self.shuffle_buffer, num_workers=self.num_workers)


@dataclass(kw_only=True)
class StreamPlan(DataPlan):
    """The live stream: it restores its position on resume, saves it into every checkpoint, and reports its realised
    mix into the metadata at the end."""

    stream: Any  # the TokenStream (also `train`)
    spec: StreamSpec
    report: dict[str, Any]  # the validation hold-out's (train_sparknet's VAL_REPORT)
    commits: dict[str, str | None]
    write_hold_out: bool  # the run folder has no checkpoint yet: its hold-out is made now
    run_dir: Path | None = None  # the run's folder: a position saved in it is checked against the plan

    def metadata(self) -> dict[str, Any]:
        """The data's record (every process calls it: the training counts are summed over them, a collective)."""
        from sparknet.common.runtime import world_size

        stats = self.stream.stats()
        # each process's stream trained on its own documents: the run's training is all of them (rank 0's alone
        # was half the tokens of a run on two processes)
        realised = all_processes_counts({k: stats[k] for k in REALISED})
        # thousands of hashes and item starts: kept in the run folder's VAL_REPORT, not the metadata
        validation = {k: v for k, v in self.report.items() if k not in ("document_hashes", "item_starts")}
        from sparknet.data.source.opening import text_column

        config = self.spec.config
        return {"config": {"path": config.path, **config.to_dict()},
                "source_revisions": {s.label: {"revision": s.revision, "commit": self.commits.get(s.label)}
                                     for s in config.mix},
                "text_columns": {s.label: text_column(s) for s in config.mix},  # the column each source was read from
                "stream": {"data_seed": self.spec.seed, "shuffle_buffer": self.spec.shuffle_buffer,
                           "shuffle_window": self.spec.window_blocks, "on_exhausted": self.spec.on_exhausted,
                           "validation": validation,
                           # `processes`: how many processes' streams the counts sum (older metadata: rank 0's only)
                           "training": {**realised, "processes": world_size(),
                                        "requested_shares": requested_shares(self.stream.config)}},
                **({"phases": self.phase_record()} if self.phase_steps else {})}

    def callbacks(self, writer: Any) -> list[Any]:
        return [StreamCallback(stream=self.stream, writer=writer)]

    def plan_phases(self, max_steps: int, batch: BatchPlan) -> list[int] | None:
        """The phases' steps (the base's), and the stream told where they and the run end in its blocks (this
        process's share of each step's global batch)."""
        ends = super().plan_phases(max_steps, batch)
        per_step = batch.global_batch // batch.devices
        self.stream.plan(phase_ends=[end * per_step for end in ends] if ends is not None else None,
                         end_blocks=max_steps * per_step)
        if self.run_dir is not None:
            self._check_saved_position(self.run_dir, per_step)
        return ends

    def _check_saved_position(self, run_dir: Path, per_step: int) -> None:
        """Refuses, before the run folder is touched (its run_config.json is rewritten with the new settings), a
        resume whose saved stream position is of other data settings than this plan's: found only on loading it,
        the refusal would leave the run's original command refused as changed settings. More steps alone are no
        change (the position holds its window's length: data/stream/token_stream.py); in a run in phases they move
        the phases' ends, which are in the position (the mixer's phase and its counts since that phase began)."""
        from sparknet.common.runtime import process_rank
        from sparknet.data.stream.token_stream import settings_changes
        from sparknet.run_files import METADATA, checkpoints_by_step
        from sparknet.train.folders import incomplete

        if (run_dir / METADATA).is_file():  # finished: open_run says so
            return
        complete = [path for path in checkpoints_by_step(run_dir) if incomplete(path) is None]
        path = complete[-1] / STREAM_STATE.format(rank=process_rank()) if complete else None
        try:
            saved = json.loads(path.read_text())["settings"] if path is not None else None
        except (OSError, ValueError, KeyError, TypeError):
            return  # a damaged position is refused where the resume reads it
        changes = settings_changes(saved, self.stream.settings) if isinstance(saved, dict) else []
        if not changes or any(change.startswith("world_size") for change in changes):
            return  # another process count is refused by the run's identity (stream_processes), naming the fix
        ends = saved.get("phase_end_blocks")
        if ends and all(change.startswith("phase_end_blocks") for change in changes):
            raise UserError(f"run {run_dir.name} is in phases, and continuing it with another budget moves their ends "
                            f"(phase_end_blocks: {ends} -> {self.stream.settings['phase_end_blocks']}): the stream's "
                            f"saved position ({path}) is laid out in the phases' blocks. Continue it with "
                            f"MAX_STEPS={ends[-1] // per_step} (its budget), or start a new RUN_NAME (INIT_FROM="
                            f"{path.parent} to start from its weights)")
        raise UserError(f"run {run_dir.name}'s saved stream position ({path}) was taken with other data settings "
                        f"({'; '.join(changes)}): the stream cannot continue from it with these. Continue the run "
                        "with the settings it was started with, or start a new RUN_NAME")

    def prepare_run(self, run_dir: Path, resume: Path | None) -> None:
        """Writes the validation blocks into a run folder that has no checkpoint yet; on resume, restores this rank's
        stream position."""
        import os

        from sparknet.common.runtime import process_rank, write_json_atomic

        if process_rank() == 0 and self.write_hold_out:
            for name, array in ((VAL_BLOCKS, self.val_tokens), (VAL_SOURCES, self.val_sources)):
                with open(run_dir / f".{name}.tmp", "wb") as f:  # renamed into place whole, as the report is
                    np.save(f, array)
                    f.flush()
                    os.fsync(f.fileno())  # made once and read on every resume: on disk before the first step
                os.replace(run_dir / f".{name}.tmp", run_dir / name)
            write_json_atomic(run_dir / VAL_REPORT, self.report)
        if resume is not None:
            path = resume / STREAM_STATE.format(rank=process_rank())
            if not path.is_file():
                raise UserError(f"{resume} holds no stream position for rank {process_rank()} ({path.name}): it "
                                "was not written by the streaming trainer with this number of processes")
            self.stream.load_state_dict(json.loads(path.read_text()))

    def close(self) -> None:
        self.stream.close()


def stream_plan(spec: StreamSpec, run_dir: Path) -> StreamPlan:
    """The mix streamed live: validation blocks held out from the start of the mix (computed once, then read from
    the run folder so a resumed run evaluates on the same blocks), and each rank's training stream after them."""
    from sparknet.common.runtime import process_rank, world_size
    from sparknet.data.stream.token_stream import TokenStream
    from sparknet.tokenizer import check_source_tokenizers, load_tokenizer

    if (run_dir / RUN_CONFIG).is_file():
        read_identity(run_dir)  # a folder in another format is refused before its hold-out is read (or made)
    tokenizer = load_tokenizer(spec.tokenizer_dir)
    check_source_tokenizers(spec.config, spec.tokenizer_dir, tokenizer)
    val_tokens, val_sources, report, commits, write_hold_out = _validation(spec, tokenizer, run_dir)
    log.info("stream: %d encoding process(es) for this training process", spec.num_workers)
    part = Part(rank=process_rank(), world_size=world_size(), on_exhausted=spec.on_exhausted,
                held_out={label: HeldOutRows.from_dict(rows) for label, rows in report["held_out"].items()},
                exclude=frozenset(report.get("document_hashes") or ()), window_blocks=spec.window_blocks)
    stream = TokenStream(spec.data(tokenizer, commits), part)
    return StreamPlan(
        phases=tuple((phase.name, phase.share) for phase in spec.config.phases) if spec.config.phased else (),
        train=stream,
        stream=stream,
        spec=spec,
        report=report,
        commits=commits,
        write_hold_out=write_hold_out,
        run_dir=run_dir,
        fixed_identity={"stream_processes": (world_size(), (
            "the stream's position is kept per process, each reading its own documents, so it resumes only on the "
            "same number of processes: run with that many (torchrun --nproc_per_node N), or start a new RUN_NAME "
            "(the packed trainer, train_sparknet_v5.py, resumes on any number)"))},
        val=BlockDataset(val_tokens),
        val_tokens=np.asarray(val_tokens),
        val_sources=val_sources,
        source_labels=list(report["source_labels"]),
        block_size=spec.block_size,
        tokenizer=tokenizer,
        tokenizer_source=spec.tokenizer_dir,
        target_tokens=spec.config.target_tokens,
        identity=_identity(spec, tokenizer),
        # the stream restores its own position: the Trainer must not replay (read and drop) the blocks seen
        trainer_arguments={"ignore_data_skip": True},
    )


def _validation(spec: StreamSpec, tokenizer: Any, run_dir: Path
                ) -> tuple[np.ndarray, np.ndarray, dict[str, Any], dict[str, str | None], bool]:
    """The validation blocks, their tokens' sources (VAL_SOURCES), their report, the commits read, and whether the
    run folder needs them written: held out now for a run that has no checkpoint yet, read from the run folder once
    it has one (every read of the run, hold-out, training and each resume, is at the commits its start resolved: a
    branch that moves during a run of days does not change its data). A damaged or lost one of the three files is
    refused in one line naming it, as every other damaged run file is."""
    from sparknet.data.source.opening import resolve_revisions

    # nothing trained yet (no checkpoint, not a finished run whose checkpoints were deleted): files a start left
    # half-written are made again
    if not checkpoints_by_step(run_dir) and not (run_dir / METADATA).is_file():
        log.info("holding out %s validation tokens from the start of the mix", f"{spec.val_tokens:,}")
        commits = resolve_revisions(spec.config)
        val_tokens, sources, report = _hold_out(spec.data(tokenizer, commits), commits)
        return _nonempty(val_tokens), sources, report, commits, True
    reads = ((VAL_REPORT, lambda: read_val_report(run_dir / VAL_REPORT)),
             (VAL_BLOCKS, lambda: read_val_blocks(run_dir / VAL_BLOCKS, spec.block_size, report["blocks"])),
             (VAL_SOURCES, lambda: _read_val_sources(run_dir / VAL_SOURCES, spec.block_size, report)))
    got = []
    for name, read in reads:
        try:
            got.append(read())
        except ValueError as exc:
            path = run_dir / name
            raise UserError(f"{path} is damaged ({exc if path.is_file() else 'missing'}): the run's validation "
                            "hold-out is read from it on every resume; restore it from a backup, or start again "
                            "with another RUN_NAME") from None
        report = got[0]
    report, blocks, sources = got
    return _nonempty(blocks), sources, report, report["commits"], False


def _hold_out(data: DataSpec, commits: dict[str, str | None]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The validation blocks from the start of the mix (`data`'s sources read at `commits`), their tokens' sources,
    and their report (VAL_REPORT): with the rows each source gave them (`held_out`, which training reads after) and
    the hashes of their documents (training drops any repeat of them)."""
    from sparknet.data.holdout import hold_out

    held = hold_out(data)
    rows = {label: source_rows.to_dict() for label, source_rows in held.rows.items()}
    report = {**held.report, "rows_held_out": {label: source_rows["rows"] for label, source_rows in rows.items()},
              "held_out": rows, "document_hashes": held.hashes, "commits": commits}
    return held.blocks, held.source_ids, report


def _read_val_sources(path: Path, block_size: int, report: dict[str, Any]) -> np.ndarray:
    """A streaming run's VAL_SOURCES, checked against its report (one row per block, ids of its source_labels);
    ValueError saying why when it is damaged."""
    labels = report["source_labels"]
    sources = read_val_blocks(path, block_size, report["blocks"])  # the same shape as the blocks'
    if sources.size and (int(sources.min()) < 0 or int(sources.max()) >= len(labels)):
        raise ValueError(f"holds source ids outside 0..{len(labels) - 1}")
    return sources


def _nonempty(val_tokens: np.ndarray) -> np.ndarray:
    if len(val_tokens) == 0:
        raise UserError("the mix gave no validation block: add data, or lower VAL_TOKENS")
    return val_tokens


def _identity(spec: StreamSpec, tokenizer: Any) -> dict[str, Any]:
    """What about the stream makes a run this run."""
    from sparknet.config.identity import local_files_fingerprint
    from sparknet.tokenizer import tokenizer_fingerprint

    return {
        "data": "stream",
        "mix": spec.config.to_dict()["mix"],
        **({"phases": spec.config.to_dict()["phases"]} if spec.config.phased else {}),
        "local_files_sha256": local_files_fingerprint(spec.config),
        "tokenizer_sha256": tokenizer_fingerprint(spec.tokenizer_dir, tokenizer),
        "block_size": spec.block_size,
        "data_seed": spec.seed,
        "shuffle_buffer": spec.shuffle_buffer,
        "shuffle_window": spec.window_blocks,
        "on_exhausted": data_rule(spec.on_exhausted),
        "val_tokens": spec.val_tokens,
    }


# the stream's figures of what training took, as the metadata records them
REALISED = ("shares", "tokens", "documents", "validation_repeats_removed", "blocks", "restarts", "exhausted", "end")


def all_processes_counts(counts: dict[str, Any]) -> dict[str, Any]:
    """`counts` (this process's REALISED figures) combined with every other process's (`combine_counts`); this
    process's alone when it is the only one. A collective: every process calls it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return counts
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, counts)  # once, at the end of the run: a small dict per process
    return combine_counts(gathered)


def combine_counts(per_process: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's REALISED figures from each process's, in rank order: each process read its own documents, so tokens,
    documents, repeats removed and blocks add up and the shares follow from the summed tokens; a source is dry where
    any process saw it run dry; restarts are the most any process made over its part of a source; the end is the
    first process's that ended (they stop together)."""
    labels = list(per_process[0]["tokens"])
    summed = {key: {label: sum(int(counts[key][label]) for counts in per_process) for label in labels}
              for key in ("tokens", "documents", "validation_repeats_removed")}
    total = sum(summed["tokens"].values())
    dry = {label for counts in per_process for label in counts["exhausted"]}
    return {**summed,
            "shares": {label: (tokens / total if total else 0.0) for label, tokens in summed["tokens"].items()},
            "blocks": sum(int(counts["blocks"]) for counts in per_process),
            "restarts": {label: max(int(counts["restarts"][label]) for counts in per_process) for label in labels},
            "exhausted": [label for label in labels if label in dry],
            "end": next((counts["end"] for counts in per_process if counts["end"] is not None), None)}


def requested_shares(config: MixConfig) -> dict[str, float]:
    total = sum(s.prob for s in config.mix)
    return {s.label: s.prob / total for s in config.mix}


class StreamCallback(TrainerCallback):
    """Saves each rank's stream position into every checkpoint (before it is marked complete), checking that it is
    the position after exactly the blocks the steps consumed; at each logging step writes the realised mix
    (`data/share/<source>`; in a run in phases, since the current phase began, and the phase as `data/phase`), the
    stream's capacity over the window (`data/capacity_tokens_per_second`: tokens handed out per second spent
    producing them while the trainer waited; far above perf/tokens_per_second when data is not the bottleneck,
    described so in TensorBoard) and the share of the window's time the trainer waited for data
    (`data/wait_fraction`), and, where a source is on the Hub, the Hub reads retried so far (`data/hub_retries`)."""

    def __init__(self, *, stream: Any, writer: Any) -> None:
        self.stream, self.writer = stream, writer
        self._last = (0.0, 0, time.perf_counter())  # busy seconds, tokens, wall clock at the last log
        self._described = False  # the capacity tag written once with its description

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        from sparknet.common.runtime import process_rank, write_json_atomic

        position = self.stream.state_dict()
        consumed = state.global_step * args.gradient_accumulation_steps * args.per_device_train_batch_size
        if position["blocks_yielded"] != consumed:
            raise RuntimeError(f"stream position after {position['blocks_yielded']} blocks, but {consumed} were "
                               "trained on: the checkpoint would not resume exactly")
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        write_json_atomic(folder / STREAM_STATE.format(rank=process_rank()), position)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.stream.step_done()

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """The realised training mix against the one asked, as the packed build reports it (this rank's stream;
        every rank reads its own share of each source)."""
        if not state.is_world_process_zero:
            return
        stats, asked = self.stream.stats(), requested_shares(self.stream.config)
        log.info("training mix (this process's stream):")
        for label, share in asked.items():
            log.info("  %-24s %14s tokens  %6.2f%% (asked %.2f%%)%s", label, f"{stats['tokens'][label]:,}",
                     100 * stats["shares"][label], 100 * share, "  ran dry" if label in stats["exhausted"] else "")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any) -> None:
        if not logs or "loss" not in logs or not state.is_world_process_zero:
            return
        stats = self.stream.stats()
        now = time.perf_counter()
        busy, tokens, wall = stats["busy_seconds"] - self._last[0], stats["timed_tokens"] - self._last[1], \
            now - self._last[2]
        self._last = (stats["busy_seconds"], stats["timed_tokens"], now)
        phased = self.stream.config.phased
        for label, share in stats["phase_shares" if phased else "shares"].items():
            self.writer.add_scalar(f"data/share/{label}", share, state.global_step)
        if phased:
            self.writer.add_scalar("data/phase", stats["phase"], state.global_step)
        if busy > 0:
            tag = "data/capacity_tokens_per_second"
            if self._described or not add_described_scalar(self.writer, tag, tokens / busy, state.global_step):
                self.writer.add_scalar(tag, tokens / busy, state.global_step)
            self._described = True
        self.writer.add_scalar("data/wait_fraction", min(1.0, busy / max(wall, 1e-9)), state.global_step)
        if not self.stream.reads_hub:  # a local mix has no Hub read to retry: no flat line of zeros
            return
        from sparknet.data.source.hub_retries import hub_retries

        # Hub reads retried after a transient failure, since this process started (each one is also a log line)
        self.writer.add_scalar("data/hub_retries", sum(hub_retries.values()), state.global_step)
