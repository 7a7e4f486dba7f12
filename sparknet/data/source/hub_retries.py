"""Reading a source with the Hub's transient failures retried (HTTP 408, 429, 5xx, a reset or stalled connection)
for up to HUB_RETRY_MINUTES: the source is opened again at the exact row reached. Written here because neither
library bounds its retries by a time the user sets: huggingface_hub retries each request 5 times (about 25 s), and
datasets' own read retries (20 of them, 5 to 60 s apart) are set to one try so that this bound is the one in force.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from sparknet.common.errors import exception_chain
from sparknet.config.mix import SourceSpec
from sparknet.data.source.opening import (
    RowDocuments,
    UnreadableSource,
    decoded,
    hub_offline,
    is_hub_source,
    open_source,
    read_rows,
)

log = logging.getLogger("sparknet.data.source.opening")

# How long a Hub source's reads are retried after a transient failure (HTTP 429 or 5xx, a reset or stalled
# connection) that huggingface_hub's and datasets' own retries did not absorb: minutes, since an outage of a minute
# must not end a run of hours. Set by the scripts' HUB_RETRY_MINUTES (`set_hub_retry_minutes`).
HUB_RETRY_SECONDS = 15 * 60.0
RETRY_FIRST_WAIT_S, RETRY_MAX_WAIT_S = 2.0, 60.0
hub_retries: Counter[str] = Counter()  # retries by source label, in this process (the stream reports them)


class HubUnavailable(UnreadableSource):
    """A Hub source still failing after HUB_RETRY_MINUTES of retries: an outage, not a mistake in the input."""


def set_hub_retry_minutes(minutes: float) -> None:
    """How long, from a failure, a Hub source's reads are retried before the run or build stops (HUB_RETRY_MINUTES)."""
    global HUB_RETRY_SECONDS
    HUB_RETRY_SECONDS = 60.0 * minutes


def transient(exc: BaseException) -> bool:
    """Whether a read failure may pass by itself: HTTP 408, 429 or 5xx, a timeout, a reset or refused connection.
    Not a 4xx that says what is wrong (401, 404), nor a parse error of the data."""
    from huggingface_hub.errors import HfHubHTTPError

    chain = exception_chain(exc)
    for e in chain:
        if isinstance(e, HfHubHTTPError):
            status = getattr(getattr(e, "response", None), "status_code", None)
            return status is not None and (status in (408, 429) or status >= 500)
    names = {c.__name__ for e in chain for c in type(e).__mro__}
    return bool(names & {"TimeoutError", "ConnectionError", "TransportError", "TimeoutException", "NetworkError",
                         "RemoteProtocolError", "ReadError", "ConnectError", "ChunkedEncodingError"})


class _Retries:
    """The retry policy of a Hub source after a transient failure: waits of 2 s doubling up to a minute, for up to
    HUB_RETRY_SECONDS since the failure (`ok()` after a success starts the count again); each retry a warning line
    and a count in `hub_retries`."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec, self.failed_at, self.attempt = spec, None, 0

    def ok(self) -> None:
        self.failed_at, self.attempt = None, 0

    def wait_or_raise(self, exc: UnreadableSource) -> None:
        if not transient(exc.cause) or hub_offline():  # offline, no wait brings the Hub back
            raise exc
        now = time.monotonic()
        self.failed_at = now if self.failed_at is None else self.failed_at
        wait = min(RETRY_MAX_WAIT_S, RETRY_FIRST_WAIT_S * 2**self.attempt)
        if now - self.failed_at + wait > HUB_RETRY_SECONDS:
            raise HubUnavailable(f"{exc} (retried for {now - self.failed_at:.0f} s: the Hub stayed unreachable "
                                 f"longer than HUB_RETRY_MINUTES={HUB_RETRY_SECONDS / 60:g})", exc.cause) from None
        self.attempt += 1
        hub_retries[self.spec.label] += 1
        reason = f"{type(exc.cause).__name__}: {' '.join(str(exc.cause).split())[:160]}"
        log.warning("source %r: reading from the Hub failed (%s); retry %d in %.0f s (for up to %g min from the "
                    "failure)", self.spec.label, reason, self.attempt, wait, HUB_RETRY_SECONDS / 60)
        time.sleep(wait)


def retried_open(spec: SourceSpec) -> Any:
    """`open_source(spec)`, with a Hub source's transient failures retried as in `retried_rows`."""
    _retries_bounded_by_hub_retry_minutes()
    retries = _Retries(spec)
    while True:
        try:
            return open_source(spec)
        except UnreadableSource as exc:
            if not is_hub_source(spec):
                raise
            retries.wait_or_raise(exc)


def retried_rows(spec: SourceSpec, rows: Any, reopen: Callable[[], Any], on_rows: Callable[[Any], None]
                 ) -> Iterator[dict[str, Any]]:
    """`read_rows`, for a Hub source with its transient failures retried (`_Retries`): the source is opened again
    at the position after the last row read (`reopen`, then the rows' own exact state; a reopening that fails in
    the outage is one more retry), until HUB_RETRY_SECONDS have passed since the failure without a row read; then
    the error says so. `on_rows` is told each reopened rows object (whose `state_dict` is then the position)."""
    if not is_hub_source(spec):
        yield from read_rows(rows, spec)
        return
    retries, position = _Retries(spec), None
    while True:
        try:
            if rows is None:
                rows = reopen()
                rows.load_state_dict(position)
                on_rows(rows)
            for row in read_rows(rows, spec):
                retries.ok()
                yield row
            return
        except UnreadableSource as exc:
            if rows is not None:
                position, rows = rows.state_dict(), None
            retries.wait_or_raise(exc)


def _retries_bounded_by_hub_retry_minutes() -> None:
    """Leaves the retrying of a failed streaming read or open to `retried_rows`. datasets retries each 20 times, 5 s
    apart (60 s apart on a 429), on top of huggingface_hub's own five retries (about 25 s): a persistent reset took
    about 9 minutes before SparkNet saw it, and a rate limit 20 minutes, whatever HUB_RETRY_MINUTES said. With one
    try each, HUB_RETRY_MINUTES bounds the wait, and each retry is counted and reopens the source at the exact row
    reached. datasets' own warning ("Retrying in 0sec [1/1]") would then be wrong, so it is left out."""
    from datasets import config

    config.STREAMING_READ_MAX_RETRIES = config.STREAMING_OPEN_MAX_RETRIES = 1
    config.STREAMING_READ_RETRY_INTERVAL = config.STREAMING_OPEN_RETRY_INTERVAL = 0
    config.STREAMING_READ_SERVER_UNAVAILABLE_RETRY_INTERVAL = config.STREAMING_READ_RATE_LIMIT_RETRY_INTERVAL = 0
    file_utils = logging.getLogger("datasets.utils.file_utils")
    if _DROP_DATASETS_RETRY_LINES not in file_utils.filters:
        file_utils.addFilter(_DROP_DATASETS_RETRY_LINES)


def _drop_datasets_retry_line(record: logging.LogRecord) -> bool:
    return record.funcName not in ("read_with_retries", "xopen")


_DROP_DATASETS_RETRY_LINES = _drop_datasets_retry_line


def iter_texts(spec: SourceSpec, tokenizer: Callable[[], Any] | None = None) -> Iterator[str]:
    """Yields the non-empty document texts of a source, in the source's order (a Hub source's transient failures
    retried from the row reached); a pre-tokenized source's ids decoded with `tokenizer()`, called only for such a
    source (None: refused)."""
    texts = RowDocuments(spec, (lambda: len(tokenizer())) if tokenizer is not None else None)
    current = [retried_open(spec)]
    for index, row in enumerate(retried_rows(spec, current[0], lambda: open_source(spec),
                                             lambda reopened: current.__setitem__(0, reopened))):
        if text := texts.document(row, index, current[0]):
            yield decoded(text, tokenizer)
