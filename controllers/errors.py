"""The controller's refusals: an HTTP status, a one-line message and a machine reason."""

from __future__ import annotations


class RequestError(Exception):
    """A request the controller refuses: HTTP status and a one-line message."""

    def __init__(self, status: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason
