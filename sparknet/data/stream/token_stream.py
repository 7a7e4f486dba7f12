"""The streaming trainer's data: the mix's sources streamed, encoded in parallel, mixed by tokens and packed into
fixed blocks on the fly (data/pipeline.py, data/blocks.py: the packed build's very loop), shuffled in windows of
blocks, with an exact position that a checkpoint saves and a resumed run restores.

Per rank, every source goes reader -> encoder -> pieces -> mixer -> packer (data/pipeline.py says how); the blocks
depend only on the data's description (`DataSpec`), the part (`Part`: this rank's training after the hold-out) and
the saved position, never on `num_workers`. At one process, with the same settings as a packed build, the stream's
blocks are the build's train.bin blocks, in windows of `Part.window_blocks` shuffled.

**Windows.** The stream gives a long document's blocks one after the other (a document of 64 blocks fills four
optimizer steps of 16 blocks), while the packed trainer samples blocks from the whole dataset: a step of the stream
then sees two or three documents, and trained measurably worse (issue 40: eval loss 6.59 against 5.30 at equal
tokens). So the blocks are taken `window_blocks` at a time and handed out in a seeded permutation of the window
(seeded by the data seed, the rank and the window's first block): the position is the window's start and the index
in it and its length, and a resume makes the window again from its start. A window never reaches past a phase's end
or the blocks the run will take (`plan`), so every step's blocks come from its phase and the run trains on exactly
the first blocks of the stream. The window's length is part of the position, not of the settings: a run continued
with more steps (ALLOW_CONFIG_CHANGE) makes its last window again as it was cut, at the old end, hands out the rest
of it, and goes on with the next blocks, so that each block of the stream is trained once. It costs `window_blocks`
blocks of memory (block_size x 2-4 bytes each) and, at the start and after each resume, the time to make one window.

The position is the one thing written by hand here, because no library gives it for this pipeline: `datasets`
saves a plain stream's position but not a shuffle buffer's, nor which encoded documents a mixer has used, nor a
packer's partial block. It holds no tokens (but the blocks of a step taken back, `rewind_to_step`): per source the
reader's position before the batch holding the first unused piece plus how many of that batch's documents to skip
and the token the piece starts at, the mixer's counts, and the piece being cut, read again on restore. Its size is
bounded by the shuffle buffers' texts.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import time
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from sparknet.common.errors import UserError
from sparknet.config.checks import problems as check_problems
from sparknet.config.identity import describe_changes
from sparknet.data.blocks import STATE_FORMAT, StreamBlocks, initial_state, position_counts
from sparknet.data.pipeline import Encoders, Pipeline
from sparknet.data.spec import DataSpec, Part


class TokenStream(torch.utils.data.IterableDataset):
    """Iterate for `{"input_ids": LongTensor[block_size], "labels": the same tensor}` blocks of the mix: the part
    `part` (training of one rank, after the hold-out) of the data `spec`.

    When a source runs dry (`part.on_exhausted`):
    - "renormalise" (default): a warning names it once; the others go on, each keeping its relative share; the
      stream ends when every source is dry.
    - "stop": a warning names it and the stream ends there (iteration stops, no exception; blocks already given
      stand), so that a trainer ends its run cleanly, with its checkpoint, rather than train on a mix that no
      longer holds or crash after hours; `stats()["end"]` says why.
    - "restart": it is read again from its start (the hold-out's rows still left out); `stats()["restarts"]` counts
      that.
    In every mode a stream that cannot give even one block raises UserError.

    `state_dict()` after any block is the exact position (plain data: JSON- and `torch.save`-able, loadable with
    `weights_only=True`); `load_state_dict` on a fresh stream with the same settings, before iterating, continues
    with exactly the blocks an uninterrupted stream would have given next. Calling `iter()` again continues from
    where the previous iterator stopped (one iterator at a time). Iterate in the main process only
    (DataLoader(num_workers=0)): the stream runs its own `spec.num_workers` encoding processes.
    """

    def __init__(self, spec: DataSpec, part: Part | None = None) -> None:
        super().__init__()
        part = part or Part()
        _check_arguments(spec, part)
        self.spec, self.part = spec, part
        self.config = spec.config
        self.block_size = spec.block_size
        self.dtype = spec.token_dtype
        self.settings = self._settings()
        self._state: dict[str, Any] | None = None  # loaded, not yet iterated
        self._pipeline: StreamBlocks | None = None
        self._windows: Windows | None = None  # the pipeline's blocks as handed out, with their position
        self._encoders: Encoders | None = None
        self._busy_seconds = 0.0
        self._timed_tokens = 0
        self._given = 0  # blocks handed to the consumer (the position's "blocks_yielded")
        # Blocks given since the last optimizer step ended, and blocks to give again before the pipeline's next:
        # a run stopped by a failure mid-step saves the step's start as its position (`rewind_to_step`).
        self._since_step: list[np.ndarray] = []
        self._replay: list[np.ndarray] = []

    def _settings(self) -> dict[str, Any]:
        """What a saved position is a position of: a position taken with other settings is refused."""
        return _plain({**self.spec.settings(), **self.part.settings()})

    def plan(self, *, phase_ends: list[int] | None = None, end_blocks: int | None = None) -> None:
        """Where each phase ends and how many blocks the run takes, in blocks of this stream (before loading a
        position or iterating): the mixer switches to the next phase's probs there, and no window reaches past
        either."""
        if phase_ends is not None and len(phase_ends) != len(self.config.phases):
            raise ValueError(f"{len(phase_ends)} phase ends for {len(self.config.phases)} phases")
        self.part = dataclasses.replace(self.part, phase_ends=tuple(phase_ends) if phase_ends is not None else None,
                                        end_blocks=end_blocks)
        self.settings = self._settings()

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if torch.utils.data.get_worker_info() is not None:
            raise UserError(
                "TokenStream cannot run in DataLoader worker processes (its position lives in the main process and "
                "it runs its own encoders): use DataLoader(num_workers=0) and the stream's num_workers"
            )
        started = time.perf_counter()
        for block in self._blocks():
            self._since_step.append(block)
            self._given += 1
            ids = torch.from_numpy(block.astype(np.int64))
            # only the time spent producing counts: the consumer's time between blocks is its own
            self._busy_seconds += time.perf_counter() - started
            self._timed_tokens += self.block_size
            yield {"input_ids": ids, "labels": ids}
            started = time.perf_counter()

    def _blocks(self) -> Iterator[np.ndarray]:
        windows = self._start()
        while self._replay:
            yield self._replay.pop(0)
        yield from windows.blocks()

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
        self._given -= taken
        self._replay[:0] = self._since_step
        self._since_step = []
        return taken

    def state_dict(self) -> dict[str, Any]:
        """The exact position after the blocks given so far (a copy; includes "blocks_yielded")."""
        if self._windows is not None:
            state = self._windows.state_dict()
            state["blocks_yielded"] = self._given
        else:
            state = copy.deepcopy(self._state) if self._state is not None else initial_state(self.spec.labels,
                                                                                               self.settings)
        if self._replay:  # blocks taken back: their tokens (at most one step's), given first on resume
            state["replay"] = [block.tolist() for block in self._replay]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from `state` at the next iteration; refuses a state saved with other settings."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise UserError(f"not a TokenStream state of format {STATE_FORMAT}: cannot resume the stream from it")
        saved = _plain(state.get("settings", {}))
        # the blocks the run will take only cut its last window, whose length the position holds (`Windows`):
        # a run continued with more steps goes on from the same position
        changes = "; ".join(settings_changes(saved, self.settings))
        if changes:
            raise UserError(f"the saved stream position was taken with other data settings ({changes}): it cannot "
                            "be resumed with these; start a new run")
        self._state = copy.deepcopy(state)
        self._replay = [np.asarray(block, dtype=self.dtype) for block in self._state.pop("replay", [])]
        self._given = int(self._state["blocks_yielded"])
        self._since_step = []
        self._pipeline, self._windows = None, None

    def stats(self) -> dict[str, Any]:
        """Realised token shares and tokens per source of the blocks made so far (since the start of the stream,
        across resumes; with windows, the current window's included), the production rate in tokens/s (time spent
        producing blocks in this process, the consumer's time excluded), blocks given, pieces and restarts per
        source, dry sources, and why it ended."""
        counts = self._pipeline.counts() if self._pipeline is not None else position_counts(self.state_dict())
        counts["blocks"] = self._given
        total = sum(counts["tokens"].values())
        in_phase = sum(counts["phase_tokens"].values())
        return {
            "shares": {label: (n / total if total else 0.0) for label, n in counts["tokens"].items()},
            # since the current phase began (tokens mixed, the piece being cut whole)
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

    def _start(self) -> Windows:
        """The live blocks from the current position (what iterating runs)."""
        if self._windows is not None:  # a second iterator goes on where the first stopped
            return self._windows
        state = copy.deepcopy(self._state) if self._state is not None else initial_state(self.spec.labels,
                                                                                           self.settings)
        state.pop("replay", None)  # kept in self._replay
        window = state.pop("window", None)
        if window is not None:  # the window is made again from its start, and handed out from the saved index
            state["blocks_yielded"] = int(window["start"])
        self._state = None
        if self._encoders is None:  # kept across iterators: the processes start once
            self._encoders = Encoders(self.spec)
            self._encoders_finalizer = weakref.finalize(self, self._encoders.terminate)
        pipeline = Pipeline(self.spec, self.part, self._encoders, state)
        self._pipeline = StreamBlocks(pipeline, state, settings=self.settings, consumer="stream")
        self._windows = Windows(self._pipeline, self.spec.seed, window)
        return self._windows


class Windows:
    """The loop's blocks as the stream hands them out: in windows of `Part.window_blocks` blocks, each in the order
    the data seed, the rank and the window's first block fix (0: in the loop's order), with the position after each
    block given. Inside a window the position is the window's start, the index in it and its length: a resume makes
    the window again from its start (`window`, the saved one) and goes on from the index."""

    def __init__(self, loop: StreamBlocks, seed: int, window: dict[str, Any] | None = None) -> None:
        self.loop, self.part, self.seed = loop, loop.part, seed
        # the window being handed out: the position at its start, its blocks in their order, the next index
        self._start: dict[str, Any] | None = None
        self._blocks: list[np.ndarray] = []
        self._index = 0
        if window is not None:  # (the start and index first: a failure while it is made again saves them)
            begin = int(window["start"])
            self._start, self._index = loop.state_dict(), int(window["index"])
            self._blocks = self._shuffled(begin, int(window["size"]) if "size" in window else self._size(begin))

    def blocks(self) -> Iterator[np.ndarray]:
        if not self.part.window_blocks:
            yield from self.loop.blocks()
            return
        while True:
            if self._start is None:
                # the position while the window is being made is its start: a failure part-way (a Hub outage)
                # saves a position that makes the whole window again, not one past the blocks read into it
                self._start, self._blocks, self._index = self.loop.state_dict(), [], 0
                self._blocks = self._shuffled(self.loop.blocks_yielded, self._size(self.loop.blocks_yielded))
                if not self._blocks:
                    self._start = None
                    return
            while self._index < len(self._blocks):
                self._index += 1
                yield self._blocks[self._index - 1]
            self._start = None

    def state_dict(self) -> dict[str, Any]:
        """The position after the blocks given (its "blocks_yielded" is the loop's: the caller counts what it
        handed on)."""
        if self._start is None:
            return self.loop.state_dict()
        state = copy.deepcopy(self._start)
        state["window"] = {"start": state["blocks_yielded"], "index": self._index}
        if self._blocks:  # made: its length, which the plan's end may have cut (none handed out before)
            state["window"]["size"] = len(self._blocks)
        return state

    def _shuffled(self, start: int, size: int) -> list[np.ndarray]:
        """The next `size` blocks of the loop (the window that starts after `start` blocks) in the window's order:
        the one way a window is made, when the stream reaches it and again when a position inside it is resumed."""
        blocks = list(itertools.islice(self.loop.blocks(), size))
        order = np.random.default_rng([self.seed, self.part.rank, start]).permutation(len(blocks))
        return [blocks[i] for i in order]

    def _size(self, start: int) -> int:
        """Blocks in the window that starts after `start` blocks: `window_blocks`, less where a phase or the run
        ends sooner."""
        ends = [end for end in (*(self.part.phase_ends or ()), self.part.end_blocks or 0) if end > start]
        return min([self.part.window_blocks, *(end - start for end in ends)])


def settings_changes(saved: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """What differs between the settings a position was saved with and `settings`, that the position cannot be
    continued with: every setting but the blocks the run will take (`end_blocks`), which only cut its last window,
    whose length the position holds."""
    def without_end(values: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in _plain(values).items() if key != "end_blocks"}

    return describe_changes(without_end(saved), without_end(settings))


def _plain(data: Any) -> Any:
    """`data` as JSON would give it back (tuples as lists), so that saved and current settings compare equal."""
    return json.loads(json.dumps(data))


def _check_arguments(spec: DataSpec, part: Part) -> None:
    """Every mistake at once, in one UserError."""
    labels = spec.labels
    problems = []
    # by the rules of the scripts' constants
    problems += check_problems({"ON_EXHAUSTED": part.on_exhausted, "BLOCK_SIZE": spec.block_size,
                                "SHUFFLE_BUFFER": spec.shuffle_buffer, "NUM_WORKERS": spec.num_workers})
    if not 0 <= part.rank < part.world_size:
        problems.append(f"rank {part.rank} of world size {part.world_size}: expected 0 <= rank < world size")
    unknown = sorted(set(part.held_out) - set(labels))
    if unknown:
        problems.append(f"the hold-out's rows name no source of the mix: {', '.join(unknown)} (sources: "
                        f"{', '.join(labels)})")
    if part.window_blocks < 0:
        problems.append(f"window_blocks: expected a count >= 0, got {part.window_blocks}")
    vocab_size = spec.vocab_size
    if not 0 <= spec.eos_id < vocab_size:
        problems.append(f"eos id {spec.eos_id} is outside the tokenizer's vocabulary of {vocab_size}")
    if problems:
        raise UserError("; ".join(problems))
