"""Mistakes a user can fix: the command line shows each as one line, ``error: ...``, not a traceback."""


class UserError(Exception):
    """Something the user can fix: a flag, a file, the data or the machine. Its message says what and how."""


class ConfigError(UserError, ValueError):
    """An argument's value is outside what is accepted; the message names the flag and the accepted range."""
