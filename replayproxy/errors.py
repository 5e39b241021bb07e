"""The project's user errors: failures the person running a command can fix, as opposed to bugs.

Raised where user input is checked (options, input files, the target) and caught once, at the CLI,
which prints them as one line and exits 2; any other exception is a bug and keeps its traceback.
Each class also derives from the builtin a caller would expect (`ValueError`, `OSError`), so code
that already catches those keeps working.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


class UserError(Exception):
    """A failure the user can act on: printed as one line, exit status 2."""


class BadOption(UserError, ValueError):
    """An option or setting that is missing, out of range or names something unknown."""


class BadInputFile(UserError, ValueError):
    """An input file (trace, result, config, prompt set, foreign trace) that cannot be used."""


class FileAccessError(UserError, OSError):
    """A file the user named cannot be opened, read or written (missing, a directory, no permission).

    Keeps the cause's errno, so callers that sort failures by it (a full disk, no permission) still
    can, while the message stays one plain line."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno

    def __str__(self) -> str:
        return str(self.args[0])


class CannotListen(UserError, OSError):
    """An address to listen on is taken or not ours (a `--listen` / `--port` to change)."""


class TargetUnreachable(UserError, ConnectionError):
    """The engine the user pointed at cannot be reached."""


class TargetRefused(UserError, PermissionError):
    """The engine answers but refuses us: no or a wrong API key."""


class RunAborted(UserError, RuntimeError):
    """A run stopped before its end by something outside its code (a sender process died)."""


class MissingFile(FileAccessError, FileNotFoundError):
    """A path the user named matches no file."""


@contextlib.contextmanager
def user_file(path: str | os.PathLike[str]) -> Iterator[None]:
    """Around opening, reading or writing a file the user named: an OSError becomes one line."""
    try:
        yield
    except UserError:
        raise
    except OSError as e:
        raise FileAccessError(f"{path}: {e.strerror or e}", e.errno) from e
