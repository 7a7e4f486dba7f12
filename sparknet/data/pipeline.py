"""The one data pipeline: sources -> encoded -> mixed, from a saved position. The packed build (data/packed/build.py)
packs its documents into split files, the streaming trainer (data/stream/token_stream.py, data/blocks.py) into
blocks handed to the Trainer; both wire it here, with the same reader, encoders, mixer, validation caps and position
format.

- `Encoders`: the batches of every source encoded on `num_workers` spawned processes, or in this process (0).
- `Pipeline`: each source read (`SourceReader`), encoded ahead (`EncodedDocuments`) and handed to the mixer with
  long documents in pieces and validation documents excluded (`SourcePieces`), the `Mixer` taking those items by
  tokens, and, while a validation hold-out is taken, `DocumentCaps` (whole documents, cut to their caps).
- The hold-out is the same rule for both: the first documents of the mixed stream, each cut to its source's cap.
  The build then goes on in the same pass (`end_hold_out`: documents in pieces, the hold-out's excluded, shares
  counted afresh); the stream, whose training is split among ranks while its validation is not, takes the hold-out
  in a pass of its own (data/holdout.py) and starts each rank's training after the rows it used
  (`SourceReader`'s `skip`), excluding the hold-out's documents by their hashes (`held_out_hashes`).

A run in phases (config "phases") mixes its training documents by the current phase's probs (`start_phase`, which
the consumer calls at the boundary it counts: the build's blocks, the stream's tokens); the validation hold-out is
mixed by the run-wide mix (`config.mix`), and `end_hold_out` starts the first phase.

Its position ("sources": per source the reader's position before the batch holding the first unused document, how
many of that batch's documents to skip, the pieces of that document already used and the documents excluded so
far; "mixer": the mixer's counts; "phase": the phase being mixed, in a run of several; "held_out": the hashes of
the hold-out's documents, once it took any) is part of both the build's saved state and the stream's. It is written
by hand because no library gives it for this pipeline (see data/stream/token_stream.py).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from sparknet.config import MixConfig
from sparknet.data.encoding.encoder_pool import EncoderPool
from sparknet.data.encoding.packer import DocumentEncoder, cut_document
from sparknet.data.encoding.read_ahead import Done, EncodedDocuments
from sparknet.data.mixing import Mixer
from sparknet.data.pieces import SourcePieces, document_hash
from sparknet.data.source.opening import is_hub_source
from sparknet.data.source.rank_reader import SourceReader


class Encoders:
    """Encoding of the sources' batches of texts: `submit(texts)` returns an object whose `get()` gives
    `(flat tokens, lengths)`, computed on `num_workers` spawned processes, or here when it is 0."""

    def __init__(self, num_workers: int, tokenizer_json: str, eos_id: int, dtype: np.dtype) -> None:
        from tokenizers import Tokenizer

        self.vocab_size = Tokenizer.from_str(tokenizer_json).get_vocab_size()  # a pre-tokenized source's bound
        self.eos_id = eos_id
        self._pool = EncoderPool(num_workers, tokenizer_json, eos_id, dtype) if num_workers > 0 else None
        self._encoder = None if self._pool is not None else DocumentEncoder(tokenizer_json, eos_id, dtype)

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


class _Closable(Protocol):
    def close(self) -> None: ...


class _Encoding(Protocol):
    def close(self) -> None: ...

    def terminate(self) -> None: ...


def stop(sources: Mapping[str, _Closable], encoders: _Encoding | None, *, clean: bool) -> None:
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


class DocumentCaps:
    """The validation hold-out's longest document per source (`packer.val_document_caps`): while `active`, a
    document costs the mixer at most its source's cap and is cut to it, and `documents_cut` counts the cuts. No
    caps: whole documents."""

    def __init__(self, caps: dict[str, int] | None, *, active: bool = True,
                 documents_cut: Mapping[str, int] | None = None) -> None:
        self.caps = dict(caps) if caps else {}
        self.active = active and bool(self.caps)
        self.documents_cut: Counter[str] = Counter(documents_cut or {})

    def costs(self) -> dict[str, Any]:
        """The mixer's cost function of each capped source (they follow `active`)."""
        return {label: (lambda doc, cap=cap: min(len(doc), cap) if self.active else len(doc))
                for label, cap in self.caps.items()}

    def cut(self, label: str, doc: np.ndarray) -> np.ndarray:
        if not self.active or len(doc) <= self.caps[label]:
            return doc
        self.documents_cut[label] += 1
        return cut_document(doc, self.caps[label])


class Pipeline:
    """Iterate for `(label, document)` in mix order: each source of `config` read from its position (`state`'s
    "sources"; none: from the start), encoded ahead by `encoders` (at most `in_flight` batches of up to `batch_docs`
    documents or `batch_chars` characters per source), mixed by tokens (`state`'s "mixer": the counts so far) and
    cut to `caps` while they are active. Otherwise documents longer than `piece_tokens` (0: none) are mixed in pieces
    and those whose hashes are in `exclude` (or the hold-out's, after it) are dropped (data/pieces.py).

    Reader options are SourceReader's: `skip` rows per source never read, this `rank`'s share of `world_size`,
    `restart` a dry source, a seeded `shuffle_buffer`. `read_ahead`: batches each source reads ahead on a thread
    (None: 8 for a Hub source, whose network waits release the GIL, 0 for local files).
    """

    def __init__(self, config: MixConfig, encoders: Encoders, *, state: dict[str, Any] | None = None,
                 seed: int, shuffle_buffer: int = 0, caps: DocumentCaps | None = None, in_flight: int = 2,
                 batch_docs: int = 256, batch_chars: int = 1 << 20, read_ahead: int | None = 0,
                 skip: Mapping[str, int] | None = None, rank: int = 0, world_size: int = 1,
                 restart: bool = False, piece_tokens: int = 0, exclude: set[str] | None = None) -> None:
        positions = (state or {}).get("sources") or {}
        self.config = config
        self.phase = int((state or {}).get("phase", 0))
        self.caps = caps or DocumentCaps(None)
        # the hold-out's documents (their hashes), which the rest never repeats
        self.held_out_hashes: set[str] = set((state or {}).get("held_out") or [])
        self._exclude = set(exclude or ()) | self.held_out_hashes
        self.sources: dict[str, SourcePieces] = {}
        try:  # added one by one, so that a failure (to open one, or later here) closes those opened
            for spec in config.mix:
                position = positions.get(spec.label) or {}
                reader = SourceReader(spec, skip=(skip or {}).get(spec.label, 0), rank=rank, world_size=world_size,
                                      restart=restart, shuffle_buffer=shuffle_buffer, seed=seed,
                                      state=position.get("reader"), vocab_size=encoders.vocab_size)
                ahead = read_ahead if read_ahead is not None else (8 if is_hub_source(spec) else 0)
                documents = EncodedDocuments(reader, encoders.submit, in_flight=in_flight, max_docs=batch_docs,
                                             max_chars=batch_chars, skip=position.get("skip", 0), read_ahead=ahead)
                self.sources[spec.label] = SourcePieces(documents, piece_tokens=piece_tokens, eos_id=encoders.eos_id,
                                                        active=not self.caps.active, exclude=self._exclude,
                                                        piece=position.get("piece", 0),
                                                        removed=position.get("removed", 0))
            # the hold-out by the run-wide mix, training by its phase's
            probs = {s.label: s.prob for s in config.mix} if self.caps.active else self._phase_probs(self.phase)
            self.mixer: Mixer[np.ndarray] = Mixer(self.sources, probs, cost=len, costs=self.caps.costs())
            if state is not None and state.get("mixer") is not None:
                self.mixer.load_state_dict(state["mixer"])
        except BaseException:
            self.close()
            raise
        self._mixed = iter(self.mixer)

    def __iter__(self) -> Iterator[tuple[str, np.ndarray]]:
        return self

    def __next__(self) -> tuple[str, np.ndarray]:
        label, doc = next(self._mixed)
        if self.caps.active:  # a hold-out document, whole (before its cut): the rest must never repeat it
            self.held_out_hashes.add(document_hash(doc))
        return label, self.caps.cut(label, doc)

    def next_of(self, label: str) -> np.ndarray | None:
        """The next document of one source, outside the mix (a saved document being cut, read again), capped."""
        doc = next(self.sources[label], None)
        return None if doc is None else self.caps.cut(label, doc)

    def end_hold_out(self) -> None:
        """Documents uncut (long ones in pieces) from here on, none that the hold-out holds, and shares counted
        afresh: what follows carries the mix by itself, whatever the hold-out's last document left out. The mixer's
        read-ahead documents go back to their sources, to be handed out again by these rules."""
        self.caps.active = False
        self._exclude.update(self.held_out_hashes)
        for label, source in self.sources.items():
            head = self.mixer.pop_head(label)
            if head is not None:
                source.put_back(head)
            source.active = True
        self.start_phase(0)

    def _phase_probs(self, index: int) -> dict[str, float]:
        probs = self.config.phases[index].prob_of()
        return {s.label: probs.get(s.label, 0.0) for s in self.config.mix}

    def start_phase(self, index: int) -> None:
        """Mixes by phase `index`'s probs from here on, its shares counted afresh (documents already read ahead are
        mixed by the new probs)."""
        self.phase = index
        self.mixer.set_probs(self._phase_probs(index))

    def used(self, label: str, unused: int = 0) -> int:
        """Documents of `label` used so far: those its source handed out, less the mixer's read-ahead and `unused`
        more that the consumer holds but has not used (the one being cut, those given back)."""
        return self.sources[label].handed_out - int(self.mixer.has_read_ahead(label)) - unused

    def state_dict(self, unused: Mapping[str, int] | None = None) -> dict[str, Any]:
        """The position after the documents used (`used`): unused ones are read again from it."""
        return {
            # copies: the live batch records hold these dicts
            "sources": {label: copy.deepcopy(source.position(self.used(label, (unused or {}).get(label, 0))))
                        for label, source in self.sources.items()},
            "mixer": self.mixer.state_dict(),
            **({"phase": self.phase} if self.config.phased else {}),
            **({"held_out": sorted(self.held_out_hashes)} if self.held_out_hashes else {}),
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
