"""Choosing the next document across sources so that the realised shares follow the mix's `prob`.

The choice is deterministic deficit scheduling with one document of look-ahead: the next document comes from the
source whose share would stand lowest halfway through its next document (smallest `(units + next/2) / prob`), where a
document's units are 1 (mixing by documents), its UTF-8 bytes (tokenizer sampling) or its tokens (datasets). The
midpoint makes every prefix err symmetrically: a source's next document is taken when the mix is
closer to its share with it than without it. (Counting the whole next document instead, `(units + next) / prob`,
always puts the long-document source behind, so a short prefix such as the validation split could miss it
entirely.) Every prefix of the output then carries the mix to within about one document per source, sources are
interleaved document by document (none drained before the next), and nothing depends on random draws, so shares
are exact and rebuilds identical. A run in phases (config "phases") gives the mixer each phase's probs in turn
(`set_probs`): the shares restart there, so every prefix of a phase carries that phase's mix; a source whose prob is
0 is not read. Written by hand because `interleave_datasets` mixes by documents with random
draws: its token shares drift with document length.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sparknet.config.mix import MixConfig

T = TypeVar("T")


@dataclass
class SourceCount:
    """What one source has contributed so far."""

    requested: float  # its normalised prob
    documents: int = 0
    units: int = 0
    exhausted: bool = False


@dataclass
class Mixer(Generic[T]):
    """Interleaves several streams; iterate it for `(label, item)` pairs in mix order.

    `cost(item)` gives an item's units (default 1: mix by documents). A source
    that runs dry is marked exhausted and the others go on, each keeping its relative share.
    """

    streams: Mapping[str, Iterable[T]]
    probs: Mapping[str, float]
    cost: Callable[[T], int] = field(default=lambda _item: 1)
    counts: dict[str, SourceCount] = field(init=False)

    def __post_init__(self) -> None:
        if set(self.streams) != set(self.probs):
            raise ValueError("streams and probs must name the same sources")
        shares = _normalised({label: self.probs[label] for label in self.streams})  # in the streams' order
        self.counts = {label: SourceCount(requested=share) for label, share in shares.items()}
        self._iters: dict[str, Iterator[T]] = {label: iter(s) for label, s in self.streams.items()}
        self._heads: dict[str, tuple[T, int]] = {}

    def _head(self, label: str) -> tuple[T, int] | None:
        """The source's next item and its cost, read ahead but not yet taken; None once the source is dry."""
        if label not in self._heads:
            try:
                item = next(self._iters[label])
            except StopIteration:
                self.counts[label].exhausted = True
                return None
            self._heads[label] = (item, self.cost(item))
        return self._heads[label]

    def __iter__(self) -> Iterator[tuple[str, T]]:
        while True:
            best, best_key = None, 0.0
            for label, count in self.counts.items():
                head = None if count.exhausted or not count.requested else self._head(label)
                if head is None:
                    continue
                key = (count.units + head[1] / 2) / count.requested  # the midpoint: see the module docstring
                if best is None or key < best_key:
                    best, best_key = label, key
            if best is None:
                return
            item, cost = self._heads.pop(best)
            count = self.counts[best]
            count.documents += 1
            count.units += cost
            yield best, item

    def take_back(self, label: str, item: T) -> None:
        """Undoes the counting of `item`, the last one mixed from `label`, which was not used after all (it will be
        read and mixed again from a saved position)."""
        count = self.counts[label]
        count.documents -= 1
        count.units -= self.cost(item)

    def has_read_ahead(self, label: str) -> bool:
        """Whether the source's next item was taken from its stream but not yet mixed (it will come out next time
        this source is chosen): a saved position must count it as not yet read."""
        return label in self._heads

    def state_dict(self) -> dict[str, dict[str, int | bool]]:
        """The counts, as plain data. Read-ahead items are not in it: whoever saves the streams' positions puts them
        before those items (`has_read_ahead`), and the choices, which depend only on counts and items, repeat."""
        return {
            label: {"documents": c.documents, "units": c.units, "exhausted": c.exhausted}
            for label, c in self.counts.items()
        }

    def load_state_dict(self, state: dict[str, dict[str, int | bool]]) -> None:
        """Restores the counts of `state_dict` (before iterating; the streams must be at the saved positions)."""
        for label, count in self.counts.items():
            saved = state[label]
            count.documents, count.units, count.exhausted = (
                int(saved["documents"]),
                int(saved["units"]),
                bool(saved["exhausted"]),
            )

    def set_probs(self, probs: Mapping[str, float]) -> None:
        """Mixes by `probs` from here on (a new phase; a source left out gets 0 and is not read), its shares counted
        afresh (document counts stay), so what follows carries the mix on its own."""
        unknown = set(probs) - set(self.counts)
        if unknown:
            raise ValueError(f"probs name sources the mixer does not have: {sorted(unknown)}")
        for label, share in _normalised({label: probs.get(label, 0.0) for label in self.counts}).items():
            self.counts[label].requested = share
            self.counts[label].units = 0

    @property
    def total_units(self) -> int:
        """Units (documents or tokens) taken from all sources so far."""
        return sum(c.units for c in self.counts.values())

    def held_out(self, n: int) -> dict[str, list[T]]:
        """The next `n` items of each source, outside the mix and its counts (held-out text the mix never used)."""
        out: dict[str, list[T]] = {}
        for label, it in self._iters.items():
            head = [self._heads.pop(label)[0]] if label in self._heads else []
            out[label] = (head + list(itertools.islice(it, max(0, n - len(head)))))[:n]
        return out

    def report(self) -> dict[str, dict[str, float | int | bool]]:
        """Per source: documents, units, realised share of units against the requested share, exhausted."""
        total = self.total_units or 1
        return {
            label: {
                "documents": c.documents,
                "units": c.units,
                "share": c.units / total,
                "requested_share": c.requested,
                "exhausted": c.exhausted,
            }
            for label, c in self.counts.items()
        }


def _normalised(probs: Mapping[str, float]) -> dict[str, float]:
    """The probs as shares that sum to 1."""
    total = sum(probs.values())
    return {label: prob / total for label, prob in probs.items()}


def mix_texts(config: MixConfig, cost: Callable[[str], int] | None = None, *, shuffle_buffer: int = 0) -> Mixer[str]:
    """A Mixer over the document texts of every source of a config, each source streamed lazily by `SourceReader`
    through its seeded shuffle buffer of `shuffle_buffer` documents (0: the source's order), as the dataset build
    reads it: with the same buffer and the config's seed, a source gives its documents in the same order here."""
    from sparknet.data.source.rank_reader import SourceReader

    streams = {
        spec.label: (text for text, _rows_read in SourceReader(spec, shuffle_buffer=shuffle_buffer, seed=config.seed))
        for spec in config.mix
    }
    probs = {spec.label: spec.prob for spec in config.mix}
    return Mixer(streams, probs) if cost is None else Mixer(streams, probs, cost)
