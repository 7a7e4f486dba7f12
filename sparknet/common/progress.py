"""SparkNet's progress bars: tqdm with changes that tqdm has no setting for.

- No estimate until there is something to estimate from: the remaining time shows "?" for the first seconds and
  the first 1% of the work, so that a slow start (encoder processes starting, the first Hub request) does not open
  with an ETA of hours.
- A bar that goes past its total (a last whole document or block) ends at 100% of what was done, and one whose
  work ended early can end full at what was done with a note (`end_short`): never "821k/?" or "20% | 3.8M/19M".
- Plain lines where the output is not a terminal (a log file, CI, `| tee`): tqdm redraws its line with carriage
  returns, which a file keeps as one garbled line. There the bar's line is written whole, once every
  `PLAIN_INTERVAL` seconds and at the end, each on its own line.
"""

from __future__ import annotations

import sys
import time
from types import ModuleType
from typing import IO, Any

from tqdm import tqdm

WARM_SECONDS = 5.0  # no ETA before this much time has passed ...
WARM_FRACTION = 0.01  # ... and this share of the total is done
PLAIN_INTERVAL = 30.0  # seconds between the lines of a bar written to a file


class _LineWriter:
    """A file for tqdm that turns its redraws (`\\r` + line) into whole lines, at most one every `interval`
    seconds, and the last state when the bar closes (its final `\\n`)."""

    def __init__(self, out: IO[str], interval: float) -> None:
        self.out, self.interval = out, interval
        self.pending = ""
        self.written = ""
        self.last = float("-inf")

    def write(self, text: str) -> None:
        closing = text.endswith("\n")
        line = text.replace("\r", "").replace("\n", "").rstrip()
        if line:
            self.pending = line
        now = time.monotonic()
        if self.pending and self.pending != self.written and (closing or now - self.last >= self.interval):
            self.out.write(self.pending + "\n")
            self.out.flush()
            self.written, self.last = self.pending, now

    def flush(self) -> None:
        self.out.flush()

    def isatty(self) -> bool:
        return False


class Progress(tqdm):
    """tqdm as described in the module docstring; the arguments are tqdm's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        out = kwargs.pop("file", None) or sys.stderr
        isatty = getattr(out, "isatty", None)
        if not (callable(isatty) and isatty()):
            out = _LineWriter(out, PLAIN_INTERVAL)
            kwargs.setdefault("ncols", 100)  # no terminal to measure
        kwargs["file"] = out
        super().__init__(*args, **kwargs)
        if self.total:
            self.bar_format = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{eta}, {rate_fmt}{postfix}]"

    def close(self) -> None:
        # Work a little past its estimate (a last whole document or block) ends at 100% of what was done: past its
        # total, tqdm would drop the total and the percentage ("821k/?").
        if self.total and self.n > self.total:
            self.total = self.n
        super().close()

    def end_short(self, note: str) -> None:
        """The work ended before the total (e.g. every source ran dry): the bar ends full at what was done, saying
        why (`note`), not stopped at "20% | 3.86M/19.1M" as if something were still coming."""
        self.total = self.n
        self.set_postfix_str(note, refresh=False)
        self.close()

    @property
    def format_dict(self) -> dict[str, Any]:
        values = super().format_dict
        total, n, elapsed = values.get("total"), values["n"], values["elapsed"]
        rate = values.get("rate") or (n - values.get("initial", 0)) / elapsed if elapsed else None
        warm = elapsed >= WARM_SECONDS and bool(total) and n - values.get("initial", 0) >= WARM_FRACTION * total
        if total and n >= total:
            values["eta"] = self.format_interval(0)
        else:
            values["eta"] = self.format_interval((total - n) / rate) if warm and rate else "?"
        return values


progress = Progress  # a progress bar by tqdm's lower-case name (tqdm's arguments: total, desc, unit, ...)


def route_library_bars(*modules: ModuleType) -> None:
    """Makes the bars these library modules draw with their module-level name `tqdm` (`from tqdm import tqdm`)
    SparkNet's: the same look on a terminal, whole lines in a log file (lm-eval's bars landed there as one 4 KB
    line of carriage returns). Their `disable=` and other tqdm arguments keep working. A module without that name
    is left alone (tests/test_hf_private_apis.py checks the names are there)."""
    for module in modules:
        if getattr(module, "tqdm", None) is tqdm:
            module.tqdm = Progress  # type: ignore[attr-defined]


def share_one_tqdm_lock() -> None:
    """Gives tqdm's base class its lock now, where every library's bar class finds it. Without one, a race can end a
    build or a run: tqdm.contrib.concurrent's thread_map (datasets resolves a source's files with it, on a
    read-ahead thread) lends the bar class it is given a lock and deletes it afterwards when that class had none,
    and a bar of that class made meanwhile on another thread then fails with "'tqdm' object has no attribute
    '_lock'" (seen in a resumed build). With a lock on the base class, thread_map finds it and puts it back."""
    tqdm.get_lock()
