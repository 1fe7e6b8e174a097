"""One rooted exception hierarchy, so users can catch ours and only ours."""
from __future__ import annotations


class PolyblocksError(Exception):
    """Base of every error raised by polyblocks_jax."""


class UnsupportedError(PolyblocksError):
    """The program uses an op, dtype or attribute that polyblocks_jax cannot compile."""

    def __init__(self, op: str, reason: str, location: str = "unknown") -> None:
        self.op, self.reason, self.location = op, reason, location
        super().__init__(self._message())

    def _message(self) -> str:
        return f"unsupported {self.op}: {self.reason} (at {self.location})"


class UnsupportedDtypeError(UnsupportedError):
    """An op on a dtype it is not computed in; worded as XLA and JAX word it ("Unsupported
    dtype ..."), which users and JAX's own tests match on whatever the backend."""

    def __init__(self, op: str, dtype: str, location: str = "unknown", supported: tuple[str, ...] = ()) -> None:
        self.dtype, self.supported = dtype, supported
        super().__init__(op, f"dtype {dtype}{self._listed()}", location)

    def _listed(self) -> str:
        return f" (supported: {', '.join(self.supported)})" if self.supported else ""

    def _message(self) -> str:
        return f"Unsupported dtype {self.dtype} in {self.op}{self._listed()} (at {self.location})"


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


class DistributedError(PolyblocksError):
    """The processes of a ``jax.distributed`` run cannot move data between them: no MPI, or
    processes not started by MPI's launcher (PJRT: FAILED_PRECONDITION)."""


class CallbackError(PolyblocksError):
    """A Python function that the program calls back (jax.debug.print, pure_callback,
    io_callback) raised; the original exception is the cause, its traceback in the message."""
