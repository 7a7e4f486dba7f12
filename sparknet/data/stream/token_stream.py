"""The streaming trainer's data: the mix's sources streamed, encoded in parallel, mixed by tokens and packed into
fixed blocks on the fly, with an exact position that a checkpoint saves and a resumed run restores.

Per rank, every source goes reader -> encoder -> mixer -> packer:
- `SourceReader` (data/source/rank_reader.py): the held-out validation rows skipped, this rank's whole shards (or,
  where the shards do not divide among the ranks, every `world_size`-th row), optionally a seeded shuffle buffer,
  optionally restarted when dry;
- `EncodedDocuments` (data/encoding/read_ahead.py): bounded batches encoded ahead on `num_workers` spawned processes
  (or in this process), as the packed build does;
- `SourcePieces` (data/pieces.py): a long document in pieces, the validation hold-out's documents excluded;
- `Mixer` with token cost (data/mixing.py): the next document from the source furthest behind its token share, so
  the blocks carry the mix from the first one on;
- `BlockPacker` (data/encoding/packer.py): documents end with eos, are concatenated and cut into `block_size` blocks;
  nothing is padded.
The blocks depend only on the inputs and the saved position, never on `num_workers`. The pipeline up to the mixer is
the packed build's (data/pipeline.py); the blocks and their position are data/blocks.py's.

The position is the one thing written by hand here, because no library gives it for this pipeline: `datasets`
saves a plain stream's position but not a shuffle buffer's, nor which encoded documents a mixer has used, nor a
packer's partial block. It holds no tokens: per source the reader's position before the batch holding the first
unused document plus how many of that batch's documents to skip, the mixer's counts, and the document being cut
("source X, from token k"), which is read again on restore. Read-ahead documents (the mixer's heads, the batches in
flight) are simply read again. Its size is bounded by the shuffle buffers' texts.

A config in phases mixes by each phase's probs in turn once `set_phase_ends` says where the phases end (the trainer
does, from its budget: data/blocks.py switches there); the position records the phase, and its settings the
phases and their ends, so that it resumes only with the same ones.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
import weakref
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import torch

from sparknet.checks import problems as check_problems
from sparknet.config import MixConfig
from sparknet.data.blocks import STATE_FORMAT, StreamBlocks
from sparknet.data.encoding.packer import token_dtype
from sparknet.data.pieces import piece_tokens_for
from sparknet.data.pipeline import DocumentCaps, Encoders, Pipeline
from sparknet.errors import UserError
from sparknet.identity import describe_changes

log = logging.getLogger(__name__)

OnExhausted = Literal["stop", "renormalise", "restart"]  # the choices are the ON_EXHAUSTED rule's (sparknet.checks)


class TokenStream(torch.utils.data.IterableDataset):
    """Iterate for `{"input_ids": LongTensor[block_size], "labels": the same tensor}` blocks of the mix.

    When a source runs dry (`on_exhausted`):
    - "renormalise" (default): a warning names it once; the others go on, each keeping its relative share; the
      stream ends when every source is dry.
    - "stop": a warning names it and the stream ends there (iteration stops, no exception; blocks already given
      stand), so that a trainer ends its run cleanly, with its checkpoint, rather than train on a mix that no
      longer holds or crash after hours; `stats()["end"]` says why.
    - "restart": it is read again from its start (after the held-out rows); `stats()["restarts"]` counts that.
    In every mode a stream that cannot give even one block raises UserError.

    `skip_documents[label]` rows at the start of a source are never read for training (the validation hold-out;
    see `hold_out_validation`). Rank `rank` of `world_size` keeps every `world_size`-th of the remaining rows, so
    ranks train on disjoint documents and each rank's stream carries the mix.

    `state_dict()` after any block is the exact position (plain data: JSON- and `torch.save`-able, loadable with
    `weights_only=True`); `load_state_dict` on a fresh stream with the same settings, before iterating, continues
    with exactly the blocks an uninterrupted stream would have given next. Calling `iter()` again continues from
    where the previous iterator stopped (one iterator at a time). Iterate in the main process only
    (DataLoader(num_workers=0)): the stream runs its own `num_workers` encoding processes.
    """

    def __init__(
        self,
        *,
        config: MixConfig,
        tokenizer_json: str,
        eos_id: int,
        block_size: int,
        seed: int,
        shuffle_buffer: int = 0,
        on_exhausted: OnExhausted = "renormalise",
        num_workers: int = 0,
        rank: int = 0,
        world_size: int = 1,
        skip_documents: dict[str, int] | None = None,
        batch_docs: int = 256,
        batch_chars: int = 1 << 20,
        document_caps: dict[str, int] | None = None,
        exclude_documents: list[str] | None = None,
    ) -> None:
        from tokenizers import Tokenizer

        super().__init__()
        skip_documents = dict(skip_documents or {})
        _check_arguments(config, on_exhausted, block_size, shuffle_buffer, num_workers, rank, world_size,
                         skip_documents)
        vocab_size = Tokenizer.from_str(tokenizer_json).get_vocab_size()
        if not 0 <= eos_id < vocab_size:
            raise UserError(f"eos id {eos_id} is outside the tokenizer's vocabulary of {vocab_size}")
        self.config = config
        self.tokenizer_json = tokenizer_json
        self.eos_id = eos_id
        self.block_size = block_size
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.on_exhausted = on_exhausted
        self.num_workers = num_workers
        self.rank, self.world_size = rank, world_size
        self.skip_documents = {spec.label: skip_documents.get(spec.label, 0) for spec in config.mix}
        self.batch_docs, self.batch_chars = batch_docs, batch_chars
        self.dtype = token_dtype(vocab_size)
        # a validation hold-out cuts documents longer than its source's cap (packer.val_document_caps)
        self.document_caps = dict(document_caps) if document_caps else None
        # training never repeats a validation document: the hold-out's documents (their hashes) are dropped
        self.exclude_documents = sorted(set(exclude_documents or ()))
        self.piece_tokens = piece_tokens_for(block_size)  # a long document is mixed in pieces (data/pieces.py)
        self.phase_ends: list[int] | None = None  # in tokens of this stream (`set_phase_ends`)
        self.settings = self._settings()
        self._state: dict[str, Any] | None = None  # loaded, not yet iterated
        self._pipeline: StreamBlocks | None = None
        self._encoders: Encoders | None = None
        self._busy_seconds = 0.0
        self._timed_tokens = 0
        # Blocks given since the last optimizer step ended, and blocks to give again before the pipeline's next:
        # a run stopped by a failure mid-step saves the step's start as its position (`rewind_to_step`).
        self._since_step: list[np.ndarray] = []
        self._replay: list[np.ndarray] = []

    def _settings(self) -> dict[str, Any]:
        """What a saved position is a position of: a position taken with other settings is refused."""
        return _plain({
            "sources": self.config.to_dict()["mix"],
            "block_size": self.block_size,
            "seed": self.seed,
            "shuffle_buffer": self.shuffle_buffer,
            "rank": self.rank,
            "world_size": self.world_size,
            "skip_documents": self.skip_documents,
            "tokenizer_sha256": hashlib.sha256(self.tokenizer_json.encode()).hexdigest(),
            "eos_id": self.eos_id,
            **({"document_caps": self.document_caps} if self.document_caps else {}),
            "piece_tokens": self.piece_tokens,
            **({"excluded_documents_sha256": hashlib.sha256(" ".join(self.exclude_documents).encode()).hexdigest()}
               if self.exclude_documents else {}),
            **({"phases": self.config.to_dict()["phases"], "phase_end_blocks": self.phase_end_blocks}
               if self.config.phased else {}),
        })

    @property
    def phase_end_blocks(self) -> list[int] | None:
        return None if self.phase_ends is None else [end // self.block_size for end in self.phase_ends]

    def set_phase_ends(self, blocks: list[int]) -> None:
        """Where each phase ends, in blocks of this stream (before loading a position or iterating): the mixer
        switches to the next phase's probs once the blocks given reach a phase's end."""
        if len(blocks) != len(self.config.phases):
            raise ValueError(f"{len(blocks)} phase ends for {len(self.config.phases)} phases")
        self.phase_ends = [end * self.block_size for end in blocks]
        self.settings = self._settings()

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if torch.utils.data.get_worker_info() is not None:
            raise UserError(
                "TokenStream cannot run in DataLoader worker processes (its position lives in the main process and "
                "it runs its own encoders): use DataLoader(num_workers=0) and the stream's num_workers"
            )
        pipeline = self.start()
        started = time.perf_counter()
        for block in self._blocks(pipeline):
            self._since_step.append(block)
            ids = torch.from_numpy(block.astype(np.int64))
            # only the time spent producing counts: the consumer's time between blocks is its own
            self._busy_seconds += time.perf_counter() - started
            self._timed_tokens += self.block_size
            yield {"input_ids": ids, "labels": ids}
            started = time.perf_counter()

    def _blocks(self, pipeline: StreamBlocks) -> Iterator[np.ndarray]:
        while self._replay:
            pipeline.blocks_yielded += 1
            yield self._replay.pop(0)
        yield from pipeline.blocks()

    @property
    def reads_hub(self) -> bool:
        """Whether a source is read from the Hub, whose outage can stop a run mid-step (`rewind_to_step`)."""
        from sparknet.data.source.opening import is_hub_source

        return any(is_hub_source(spec) for spec in self.config.mix)

    def step_done(self) -> None:
        """The blocks given so far are trained on: a later `rewind_to_step` goes back no further."""
        self._since_step.clear()

    def rewind_to_step(self) -> int:
        """Takes back the blocks given since the last `step_done` (a step that will not run): they are given again
        first, after a resume from the position `state_dict` now describes. Returns how many."""
        taken = len(self._since_step)
        if self._pipeline is not None:
            self._pipeline.blocks_yielded -= taken
        self._replay[:0] = self._since_step
        self._since_step = []
        return taken

    def state_dict(self) -> dict[str, Any]:
        """The exact position after the blocks given so far (a copy; includes "blocks_yielded")."""
        if self._pipeline is not None:
            state = self._pipeline.state_dict()
        elif self._state is not None:
            state = copy.deepcopy(self._state)
        else:
            state = self._initial_state()
        if self._replay:  # blocks taken back: their tokens (at most one step's), given first on resume
            state["replay"] = [block.tolist() for block in self._replay]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from `state` at the next iteration; refuses a state saved with other settings."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise UserError(f"not a TokenStream state of format {STATE_FORMAT}: cannot resume the stream from it")
        saved = state.get("settings", {})
        if "piece_tokens" not in saved and _plain({**saved, "piece_tokens": self.piece_tokens}) == self.settings:
            # a position saved before long documents were mixed in pieces: resumed as it was taken, whole
            self.piece_tokens = 0
            self.settings = _plain(saved)
        if _plain(saved) != self.settings:
            changes = "; ".join(describe_changes(_plain(saved), self.settings))
            raise UserError(f"the saved stream position was taken with other data settings ({changes}): it cannot "
                            "be resumed with these; start a new run")
        self._state = copy.deepcopy(state)
        self._replay = [np.asarray(block, dtype=self.dtype) for block in self._state.pop("replay", [])]
        self._since_step = []
        self._pipeline = None

    def stats(self) -> dict[str, Any]:
        """Realised token shares and tokens per source of the blocks given so far (since the start of the stream,
        across resumes), the production rate in tokens/s (time spent producing blocks in this process, the
        consumer's time excluded), blocks, documents and restarts per source, dry sources, and why it ended."""
        if self._pipeline is not None:
            counts = self._pipeline.counts()
        else:
            state = self.state_dict()
            counts = {
                "tokens": dict(state["packer"]["tokens"]),
                "documents": {label: c["documents"] for label, c in state["mixer"].items()},
                "validation_repeats_removed": {label: int(position.get("removed", 0))
                                               for label, position in state["sources"].items()},
                "restarts": dict(state["restarts"]),
                "exhausted": [label for label, c in state["mixer"].items() if c["exhausted"]],
                "blocks": state["blocks_yielded"],
                "end": state["end"],
                "phase": int(state.get("phase", 0)),
                "phase_tokens": {label: c["units"] for label, c in state["mixer"].items()},
            }
        total = sum(counts["tokens"].values())
        in_phase = sum(counts["phase_tokens"].values())
        return {
            "shares": {label: (n / total if total else 0.0) for label, n in counts["tokens"].items()},
            # since the current phase began (tokens mixed, the document being cut whole)
            "phase_shares": {label: (n / in_phase if in_phase else 0.0) for label, n in counts["phase_tokens"].items()},
            "tokens_per_second": self._timed_tokens / self._busy_seconds if self._busy_seconds else 0.0,
            "busy_seconds": self._busy_seconds,  # time this process spent waiting inside the stream
            "timed_tokens": self._timed_tokens,
            **counts,
        }

    def close(self) -> None:
        """Terminates the encoding processes; the position stays readable."""
        if self._encoders is not None:
            self._encoders_finalizer.detach()
            self._encoders.terminate()
            self._encoders = None

    def start(self) -> StreamBlocks:
        """The live blocks from the current position (what iterating runs; data/holdout.py takes the validation
        blocks from it)."""
        state = self.state_dict()
        state.pop("replay", None)  # kept in self._replay
        self._state = None
        if self._encoders is None:  # kept across iterators: the processes start once
            self._encoders = Encoders(self.num_workers, self.tokenizer_json, self.eos_id, self.dtype)
            self._encoders_finalizer = weakref.finalize(self, self._encoders.terminate)
        pipeline = Pipeline(self.config, self._encoders, state=state, seed=self.seed,
                            shuffle_buffer=self.shuffle_buffer, caps=DocumentCaps(self.document_caps),
                            in_flight=max(2, 2 * self.num_workers), batch_docs=self.batch_docs,
                            batch_chars=self.batch_chars, skip=self.skip_documents, rank=self.rank,
                            world_size=self.world_size, restart=self.on_exhausted == "restart",
                            piece_tokens=self.piece_tokens, exclude=set(self.exclude_documents))
        self._pipeline = StreamBlocks(pipeline, state, block_size=self.block_size, dtype=self.dtype,
                                      on_exhausted=self.on_exhausted, settings=self.settings,
                                      phase_ends=self.phase_ends)
        return self._pipeline

    def _initial_state(self) -> dict[str, Any]:
        labels = list(self.skip_documents)
        return {
            "format": STATE_FORMAT,
            "settings": copy.deepcopy(self.settings),
            "blocks_yielded": 0,
            "end": None,
            "sources": {label: {"reader": None, "skip": 0} for label in labels},
            "mixer": {label: {"documents": 0, "units": 0, "exhausted": False} for label in labels},
            "packer": {"tokens": {label: 0 for label in labels}, "documents": {label: 0 for label in labels}},
            "current": None,
            "warned": [],
            "restarts": {label: 0 for label in labels},
        }


def _plain(data: Any) -> Any:
    """`data` as JSON would give it back (tuples as lists), so that saved and current settings compare equal."""
    return json.loads(json.dumps(data))


def _check_arguments(config: MixConfig, on_exhausted: str, block_size: int, shuffle_buffer: int, num_workers: int,
                     rank: int, world_size: int, skip_documents: dict[str, int]) -> None:
    """Every mistake at once, in one UserError."""
    labels = [spec.label for spec in config.mix]
    problems = []
    # by the rules of the scripts' constants
    problems += check_problems({"ON_EXHAUSTED": on_exhausted, "BLOCK_SIZE": block_size,
                                "SHUFFLE_BUFFER": shuffle_buffer, "NUM_WORKERS": num_workers})
    if not 0 <= rank < world_size:
        problems.append(f"rank {rank} of world size {world_size}: expected 0 <= rank < world size")
    unknown = sorted(set(skip_documents) - set(labels))
    if unknown:
        problems.append(f"skip_documents names no source of the mix: {', '.join(unknown)} (sources: "
                        f"{', '.join(labels)})")
    if any(not isinstance(n, int) or n < 0 for n in skip_documents.values()):
        problems.append(f"skip_documents: expected counts >= 0, got {skip_documents}")
    if problems:
        raise UserError("; ".join(problems))
