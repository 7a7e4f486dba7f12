"""The one exception type for mistakes a user can fix; scripts print its message without a traceback. And the chain
of an exception, which the code that tells a full disk, a transient Hub failure or a gated dataset apart reads."""


class UserError(Exception):
    """A mistake in the user's input (flag, config, path): the message names it and says how to fix it."""

    exit_code = 1


class UsageError(UserError):
    """A bad command line: unknown flag or a value of the wrong type (exit status 2, like argparse)."""

    exit_code = 2


def exception_chain(exc: BaseException) -> list[BaseException]:
    """`exc` and what caused it, outermost first: each exception's `__cause__` (raise ... from), else its
    `__context__` (raised while handling), stopping at a loop."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain
