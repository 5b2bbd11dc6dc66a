"""Error types that the CLI maps to exit codes (2: bad input, 1: runtime failure)."""

from __future__ import annotations


class LightPipeError(Exception):
    """Base class of LightPipe's own errors."""

    exit_code = 1


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
        return f"{prefix}{where}{self.message}"


class SpecError(InputError):
    """A scenario spec failed validation."""


class RuntimeFailure(LightPipeError):
    """Something failed while running (a tool missing, a process died): exit code 1."""

    exit_code = 1
