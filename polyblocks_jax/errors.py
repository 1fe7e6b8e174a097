"""One rooted exception hierarchy, so users can catch ours and only ours."""
from __future__ import annotations


class PolyblocksError(Exception):
    """Base of every error raised by polyblocks_jax."""


class UnsupportedError(PolyblocksError):
    """The program uses an op, dtype or attribute that polyblocks_jax cannot compile."""

    def __init__(self, op: str, reason: str, location: str = "unknown") -> None:
        self.op, self.reason, self.location = op, reason, location
        super().__init__(f"unsupported {op}: {reason} (at {location})")


class InvalidProgramError(PolyblocksError):
    """The program could not be read: malformed text, truncated artifact, bad signature."""


class CompilationError(PolyblocksError):
    """A pipeline stage failed on a module it should have accepted (a bug of ours)."""

    def __init__(self, stage: str, message: str, module_text: str | None = None) -> None:
        self.stage, self.module_text = stage, module_text
        super().__init__(f"stage {stage!r} failed: {message}")


class ResourceExhaustedError(PolyblocksError, MemoryError):
    """The program needs more memory than this process may use (PJRT: RESOURCE_EXHAUSTED)."""


class InvalidArgumentError(PolyblocksError, ValueError):
    """Arguments passed to an executable do not match its signature."""


class CallbackError(PolyblocksError):
    """A Python function that the program calls back (jax.debug.print, pure_callback,
    io_callback) raised; the original exception is the cause, its traceback in the message."""
