"""The exception chain the full-disk, Hub-failure and gated-dataset checks read
(sparknet.common.errors.exception_chain)."""

from __future__ import annotations

from sparknet.common.errors import exception_chain


def test_the_chain_follows_causes_then_contexts_outermost_first_and_stops_at_a_loop() -> None:
    root = OSError(28, "No space left on device")
    try:
        try:
            raise root
        except OSError:
            raise KeyError("while handling") from None  # a suppressed context still leaves __context__ set
    except KeyError as exc:
        middle = exc
    outer = RuntimeError("outer")
    outer.__cause__ = middle
    assert exception_chain(outer) == [outer, middle, root]
    root.__context__ = outer  # a loop (possible when an exception is re-raised inside its own handler)
    assert exception_chain(outer) == [outer, middle, root]
    assert exception_chain(root) == [root, outer, middle]
