"""The project's user errors: failures the person running a command can fix, as opposed to bugs.

Raised where user input is checked (options, input files, the target) and caught once, at the CLI,
which prints them as one line and exits 2; any other exception is a bug and keeps its traceback.
Each class also derives from the builtin a caller would expect (`ValueError`, `OSError`), so code
that already catches those keeps working.
"""

from __future__ import annotations


class UserError(Exception):
    """A failure the user can act on: printed as one line, exit status 2."""


class BadOption(UserError, ValueError):
    """An option or setting that is missing, out of range or names something unknown."""


class BadInputFile(UserError, ValueError):
    """An input file (trace, result, config, prompt set, foreign trace) that cannot be used."""


class FileAccessError(UserError, OSError):
    """A file the user named cannot be opened, read or written (missing, a directory, no permission)."""


class TargetUnreachable(UserError, OSError):
    """The engine or upstream the user pointed at does not answer as one."""


class RunAborted(UserError, RuntimeError):
    """A run stopped before its end by something outside its code (a sender process died)."""
