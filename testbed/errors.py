"""Error types that the CLI maps to exit codes (2: bad input, 1: runtime failure)."""

from __future__ import annotations


def _rebuild(cls: type, args: tuple, state: dict) -> LightPipeError:
    """Recreate a LightPipe error in another process without calling its __init__."""
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class LightPipeError(Exception):
    """Base class of LightPipe's own errors."""

    exit_code = 1

    def __reduce__(self) -> tuple:
        # Picklable whatever the subclass's __init__ signature (a sweep worker's error
        # must reach the parent process intact; the default pickling calls __init__(*args)).
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


class InputError(LightPipeError):
    """Bad user input (spec, trace, CLI value): exit code 2, one line naming the field."""

    exit_code = 2

    def __init__(self, path: str, message: str, source: str | None = None) -> None:
        self.path = path
        self.message = message
        self.source = source
        super().__init__(self.line())

    def line(self) -> str:
        prefix = f"{self.source}: " if self.source else ""
        where = f"{self.path}: " if self.path else ""
        text = f"{prefix}{where}{self.message}"
        # One line whatever the input held (a key or value with a newline, say).
        return text.replace("\r", "\\r").replace("\n", "\\n")


class SpecError(InputError):
    """A scenario spec failed validation."""


class RuntimeFailure(LightPipeError):
    """Something failed while running (a tool missing, a process died): exit code 1."""

    exit_code = 1
