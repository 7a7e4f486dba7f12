"""Choosing the next document across sources so that the realised shares follow the mix's `prob`.

The choice is deterministic deficit scheduling: the next document comes from the active source furthest behind its
share (smallest `units / prob`), where a document's units are 1 (mixing by documents, for tokenizer sampling) or
its token count (mixing by tokens, for datasets). Every prefix of the output then carries the mix to within one
document per source, sources are interleaved document by document (none drained before the next), and nothing
depends on random draws, so shares are exact and rebuilds identical. Written by hand because `interleave_datasets`
mixes by documents with random draws: its token shares drift with document length.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sparknet.config import MixConfig

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

    `cost(item)` gives an item's units (default 1: mix by documents). A source that runs dry is marked exhausted and
    the others go on, each keeping its relative share.
    """

    streams: Mapping[str, Iterable[T]]
    probs: Mapping[str, float]
    cost: Callable[[T], int] = field(default=lambda _item: 1)
    counts: dict[str, SourceCount] = field(init=False)

    def __post_init__(self) -> None:
        if set(self.streams) != set(self.probs):
            raise ValueError("streams and probs must name the same sources")
        total = sum(self.probs.values())
        self.counts = {label: SourceCount(requested=self.probs[label] / total) for label in self.streams}
        self._iters: dict[str, Iterator[T]] = {label: iter(s) for label, s in self.streams.items()}

    def _next_label(self) -> str | None:
        active = [label for label in self._iters if not self.counts[label].exhausted]
        if not active:
            return None
        return min(active, key=lambda label: self.counts[label].units / self.counts[label].requested)

    def __iter__(self) -> Iterator[tuple[str, T]]:
        while (label := self._next_label()) is not None:
            try:
                item = next(self._iters[label])
            except StopIteration:
                self.counts[label].exhausted = True
                continue
            count = self.counts[label]
            count.documents += 1
            count.units += self.cost(item)
            yield label, item

    @property
    def total_units(self) -> int:
        """Units (documents or tokens) taken from all sources so far."""
        return sum(c.units for c in self.counts.values())

    def held_out(self, n: int) -> dict[str, list[T]]:
        """The next `n` items of each source, outside the mix and its counts (held-out text the mix never used)."""
        out: dict[str, list[T]] = {}
        for label, it in self._iters.items():
            out[label] = [] if self.counts[label].exhausted else list(itertools.islice(it, n))
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


def mix_texts(config: MixConfig, cost: Callable[[str], int] | None = None) -> Mixer[str]:
    """A Mixer over the document texts of every source of a config, each source streamed lazily."""
    from sparknet.data.sources import iter_texts

    streams = {spec.label: iter_texts(spec) for spec in config.mix}
    probs = {spec.label: spec.prob for spec in config.mix}
    return Mixer(streams, probs) if cost is None else Mixer(streams, probs, cost)
