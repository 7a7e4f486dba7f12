"""The one exception type for mistakes a user can fix; scripts print its message without a traceback."""


class UserError(Exception):
    """A mistake in the user's input (flag, config, path): the message names it and says how to fix it."""

    exit_code = 1


class UsageError(UserError):
    """A bad command line: unknown flag or a value of the wrong type (exit status 2, like argparse)."""

    exit_code = 2
