"""PJRT_Error objects: a code and a message, mapped from our exceptions.

Error_Destroy/Message/GetCode/ForEachPayload must never fail (jaxlib recurses or
crashes), so they read the error through closures bound when the table is built and
fall back to a static message.
"""
from __future__ import annotations

import ctypes

from pypjrt._abi import pjrt_0_114 as abi

from polyblocks_jax.errors import DistributedError, InvalidArgumentError, InvalidProgramError, UnsupportedError
from polyblocks_jax.pjrt import handles


class PjrtError(Exception):
    """An error with an explicit PJRT code, raised inside callbacks."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def unimplemented(what: str) -> PjrtError:
    return PjrtError(abi.PJRT_Error_Code_UNIMPLEMENTED, f"polyblocks PJRT: {what} is not supported")


def invalid(message: str) -> PjrtError:
    return PjrtError(abi.PJRT_Error_Code_INVALID_ARGUMENT, f"polyblocks PJRT: {message}")


class Error:
    """A live PJRT_Error: the message buffer stays alive until Error_Destroy."""
    __slots__ = ("code", "message", "immortal")

    def __init__(self, code: int, message: str, immortal: bool = False) -> None:
        self.code, self.immortal = code, immortal
        self.message = ctypes.create_string_buffer(message.encode("utf-8", "replace"))


def code_of(exc: BaseException) -> int:
    if isinstance(exc, PjrtError):
        return exc.code
    if isinstance(exc, UnsupportedError):
        return abi.PJRT_Error_Code_UNIMPLEMENTED
    if isinstance(exc, (InvalidProgramError, InvalidArgumentError, ValueError, TypeError, LookupError)):
        return abi.PJRT_Error_Code_INVALID_ARGUMENT
    if isinstance(exc, DistributedError):
        return abi.PJRT_Error_Code_FAILED_PRECONDITION
    if isinstance(exc, MemoryError):
        return abi.PJRT_Error_Code_RESOURCE_EXHAUSTED
    return abi.PJRT_Error_Code_INTERNAL


def describe(exc: BaseException) -> str:
    if isinstance(exc, PjrtError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def from_exception(exc: BaseException) -> int:
    """A new PJRT_Error handle for ``exc``; owned by jaxlib until Error_Destroy."""
    return handles.register(Error(code_of(exc), describe(exc)))


# Returned when even building an error fails (e.g. during interpreter finalization).
FALLBACK_ERROR = handles.register(Error(abi.PJRT_Error_Code_INTERNAL, "polyblocks PJRT: internal error",
                                         immortal=True))
