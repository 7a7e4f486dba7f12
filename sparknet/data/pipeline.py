"""The one data pipeline: sources -> encoded -> pieces -> mixed, for one part of the stream (data/spec.py `Part`),
from a saved position. data/blocks.py packs what it gives into blocks; the packed build, the streaming trainer and
the validation hold-out all run it, with the same reader, encoders, pieces, mixer and position format.

- `Encoders`: the batches of every source encoded on `num_workers` spawned processes, or in this process (0).
- `Pipeline`: each source read (`SourceReader`), encoded ahead (`EncodedDocuments`) and handed to the mixer in pieces
  (`SourcePieces`), the `Mixer` taking those items by tokens.
- The validation part reads each source in its own order on one process and mixes by the run-wide mix
  (`config.mix`), taking at most each source's cap of one document; a training part reads this rank's rows after
  the hold-out's (the rest of each document it cut first), through the seeded shuffle buffer, without the hold-out's
  documents, and mixes by its phase's probs (`start_phase`, which the packer calls where the phase ends).

Its position ("sources": per source the reader's position before the batch holding the first unused item, how many
of that batch's documents to skip, the token of that document the item starts at and the documents excluded so far;
"mixer": the mixer's counts; "phase": the phase being mixed, in a run of several) is written by hand because no
library gives it for this pipeline (see data/stream/token_stream.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from sparknet.data.encoding.encoder_pool import EncoderPool
from sparknet.data.encoding.packer import DocumentEncoder
from sparknet.data.encoding.read_ahead import Done, EncodedDocuments
from sparknet.data.mixing import Mixer
from sparknet.data.pieces import SourcePieces
from sparknet.data.source.opening import is_hub_source
from sparknet.data.source.rank_reader import SourceReader
from sparknet.data.spec import DataSpec, Part


class Encoders:
    """Encoding of the sources' batches of texts: `submit(texts)` returns an object whose `get()` gives
    `(flat tokens, lengths)`, computed on `spec.num_workers` spawned processes, or here when it is 0."""

    def __init__(self, spec: DataSpec) -> None:
        self.vocab_size = spec.vocab_size  # a pre-tokenized source's bound
        self.eos_id = spec.eos_id
        dtype = spec.token_dtype
        self._pool = EncoderPool(spec.num_workers, spec.tokenizer_json, spec.eos_id, dtype) \
            if spec.num_workers > 0 else None
        self._encoder = None if self._pool is not None else DocumentEncoder(spec.tokenizer_json, spec.eos_id, dtype)

    def submit(self, texts: list[str]) -> Any:
        if self._pool is not None:
            return self._pool.submit(texts)
        assert self._encoder is not None
        return Done(self._encoder(texts))

    def close(self) -> None:
        """Waits for the processes to finish what they were given, then lets them exit."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def terminate(self) -> None:
        """Stops the processes now (batches not yet encoded are dropped)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None


def stop(sources: Mapping[str, SourcePieces], encoders: Encoders | None, *, clean: bool) -> None:
    """Closes the readers and the encoders: `clean`, waiting for the encoders to finish; else, or when anything
    (a Ctrl-C included) interrupts that, stopping them at once. Encoders left running would hold the interpreter's
    exit for good (it joins its child processes)."""
    try:
        for source in sources.values():
            source.close()
        if encoders is not None and clean:
            encoders.close()
            encoders = None
    finally:
        if encoders is not None:
            encoders.terminate()


class Pipeline:
    """Iterate for `(label, piece)` in mix order: the part `part` of the data `spec`, each source read from its
    position (`state`'s "sources"; none: from the start), encoded ahead by `encoders` and mixed by tokens (`state`'s
    "mixer": the counts so far). `continues(label)` says whether the piece just given ends before its document."""

    def __init__(self, spec: DataSpec, part: Part, encoders: Encoders, state: dict[str, Any] | None = None) -> None:
        positions = (state or {}).get("sources") or {}
        self.spec, self.part = spec, part
        self.config = spec.config
        self.phase = int((state or {}).get("phase", 0))
        caps = spec.document_caps() if not part.training else {}
        self.sources: dict[str, SourcePieces] = {}
        try:  # added one by one, so that a failure (to open one, or later here) closes those opened
            for source in spec.config.mix:
                position = positions.get(source.label) or {}
                reader = SourceReader(source, held_out=part.held_out.get(source.label), rank=part.rank,
                                      world_size=part.world_size,
                                      restart=part.training and part.on_exhausted == "restart",
                                      shuffle_buffer=spec.shuffle_buffer if part.training else 0, seed=spec.seed,
                                      state=position.get("reader"), vocab_size=encoders.vocab_size)
                ahead = spec.read_ahead if spec.read_ahead is not None else (8 if is_hub_source(source) else 0)
                documents = EncodedDocuments(reader, encoders.submit, in_flight=max(2, 2 * spec.num_workers),
                                             max_docs=spec.batch_docs, max_chars=spec.batch_chars,
                                             skip=position.get("skip", 0), read_ahead=ahead)
                self.sources[source.label] = SourcePieces(documents, piece_tokens=spec.piece_tokens,
                                                          cap=caps.get(source.label), exclude=part.exclude,
                                                          offset=position.get("offset", 0),
                                                          removed=position.get("removed", 0))
            # the hold-out by the run-wide mix, training by its phase's
            probs = self._phase_probs(self.phase) if part.training else {s.label: s.prob for s in spec.config.mix}
            self.mixer: Mixer[np.ndarray] = Mixer(self.sources, probs, cost=len)
            if state is not None and state.get("mixer") is not None:
                self.mixer.load_state_dict(state["mixer"])
        except BaseException:
            self.close()
            raise
        self._mixed = iter(self.mixer)

    def __iter__(self) -> Iterator[tuple[str, np.ndarray]]:
        return self

    def __next__(self) -> tuple[str, np.ndarray]:
        return next(self._mixed)

    def continues(self, label: str) -> bool:
        """Whether the last piece of `label` ends before its document does (the packer ends it with a block)."""
        return self.sources[label].continues

    def give_back(self, label: str, tokens: int) -> None:
        """The last `tokens` tokens of the piece just mixed from `label` are not used now: its source hands them out
        again first, and its share counts them then."""
        self.sources[label].give_back(tokens)
        self.mixer.counts[label].units -= tokens

    def extend(self, label: str, tokens: int) -> np.ndarray:
        """Up to `tokens` more of the document of the piece just mixed from `label`, past its cap (its share counts
        them)."""
        more = self.sources[label].extend(tokens)
        self.mixer.counts[label].units += len(more)
        return more

    def next_of(self, label: str) -> np.ndarray | None:
        """The next piece of one source, outside the mix (a saved piece being cut, read again)."""
        return next(self.sources[label], None)

    def _phase_probs(self, index: int) -> dict[str, float]:
        probs = self.config.phases[index].prob_of()
        return {s.label: probs.get(s.label, 0.0) for s in self.config.mix}

    def start_phase(self, index: int) -> None:
        """Mixes by phase `index`'s probs from here on, its shares counted afresh (pieces already read ahead are
        mixed by the new probs)."""
        self.phase = index
        self.mixer.set_probs(self._phase_probs(index))
        self._mixed = iter(self.mixer)  # the mix over again: the last phase's ended where its sources all ran dry

    def used(self, label: str, unused: int = 0) -> int:
        """Items of `label` used so far: those its source handed out, less the mixer's read-ahead and `unused`
        more that the consumer holds but has not used (the one being cut, those given back)."""
        return self.sources[label].handed_out - int(self.mixer.has_read_ahead(label)) - unused

    def state_dict(self, unused: Mapping[str, int] | None = None) -> dict[str, Any]:
        """The position after the items used (`used`): unused ones are read again from it."""
        return {
            # copies: the live batch records hold these dicts
            "sources": {label: copy.deepcopy(source.position(self.used(label, (unused or {}).get(label, 0))))
                        for label, source in self.sources.items()},
            "mixer": self.mixer.state_dict(),
            **({"phase": self.phase} if self.config.phased else {}),
        }

    def removed(self, unused: Mapping[str, int] | None = None) -> dict[str, int]:
        """Per source, the documents excluded (a hold-out document repeated) before the position."""
        return {label: int(source.position(self.used(label, (unused or {}).get(label, 0)))["removed"])
                for label, source in self.sources.items()}

    def exhausted(self) -> list[str]:
        return [label for label, c in self.mixer.counts.items() if c.exhausted]

    def close(self) -> None:
        """Stops the sources' read-ahead threads; positions stay valid."""
        for source in self.sources.values():
            source.close()
