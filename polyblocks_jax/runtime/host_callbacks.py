"""Python functions that compiled code calls back (jax.debug.print, pure_callback, io_callback).

A callback is registered under a key that the program carries (pjrt/host_callbacks.py puts
it there). Compiled code calls one C-callable trampoline with that key and an array of
data pointers (the operands' buffers, then the results'); the trampoline wraps the
operands as numpy arrays, calls the function and writes what it returns into the results.
The registry holds its entries weakly: JAX keeps a program's callbacks alive with its
executable, and so does the executable compiled from it (``Executable.host_callbacks``).

Compiled code cannot unwind through a Python exception. The first exception of a call is
kept for the thread's running program, the callbacks after it are skipped (their results
zeroed), loops that call back stop (their condition asks ``FAILED_ADDRESS``), and
``running()`` raises it once the code returns.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import math
import threading
import traceback
import weakref
from typing import Callable, Iterator, Sequence

import numpy as np

from polyblocks_jax.cpu.array_pool import data_address
from polyblocks_jax.errors import CallbackError
from polyblocks_jax.runtime.foreign_memory import array_type

# The custom_call target of a callback; its backend_config is the key, in decimal.
TARGET = "polyblocks.host_callback"

Spec = tuple[tuple[int, ...], np.dtype]


class _Buffer:
    """What one operand or result buffer holds."""
    __slots__ = ("shape", "dtype", "nbytes")

    def __init__(self, shape: Sequence[int], dtype) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize


class HostCallback:
    """A registered callback: ``function(*operands)`` returns one array per result spec."""
    __slots__ = ("key", "function", "operands", "results", "__weakref__")

    def __init__(self, key: int, function: Callable, operands: Sequence[Spec], results: Sequence[Spec]) -> None:
        self.key, self.function = key, function
        self.operands = [_Buffer(s, d) for s, d in operands]
        self.results = [_Buffer(s, d) for s, d in results]

    def __call__(self, *args) -> Sequence:
        """JAX's host callbacks are callables: this one is its function."""
        return self.function(*args)


_REGISTRY: weakref.WeakValueDictionary[int, HostCallback] = weakref.WeakValueDictionary()
_KEYS = itertools.count(1)
_LOCK = threading.Lock()


def register(function: Callable, operands: Sequence[Spec], results: Sequence[Spec]) -> HostCallback:
    """A new entry for ``function``; the caller keeps it alive (keys are never reused)."""
    with _LOCK:
        entry = HostCallback(next(_KEYS), function, operands, results)
        _REGISTRY[entry.key] = entry
    return entry


def lookup(key: int) -> HostCallback | None:
    return _REGISTRY.get(key)


class _Call:
    """One running program on this thread: the first exception its callbacks raised."""
    __slots__ = ("error", "text")

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.text = ""


_THREAD = threading.local()


def _calls() -> list[_Call]:
    calls = getattr(_THREAD, "calls", None)
    if calls is None:
        calls = _THREAD.calls = []
    return calls


@contextlib.contextmanager
def running() -> Iterator[None]:
    """Around one call of compiled code that may call back: raises what a callback raised.

    Nested on one thread when a callback runs another program."""
    calls = _calls()
    call = _Call()
    calls.append(call)
    try:
        yield
    finally:
        calls.pop()
    if call.error is not None:
        if not isinstance(call.error, Exception):  # KeyboardInterrupt, SystemExit
            raise call.error
        raise CallbackError(f"a host callback raised {call.text}") from call.error


def _trampoline(key: int, pointers: int) -> None:
    """Called by compiled code with the GIL taken by ctypes; must not raise."""
    entry = _REGISTRY.get(key)
    calls = _calls()
    call = calls[-1] if calls else None
    if entry is None:  # the program outlived its callback: only possible through misuse
        if call is not None and call.error is None:
            call.error, call.text = CallbackError(f"host callback {key} is no longer alive"), ""
        return
    addresses = array_type(ctypes.c_void_p, len(entry.operands) + len(entry.results)).from_address(pointers)
    outputs = list(addresses[len(entry.operands):])
    if call is not None and call.error is not None:
        _zero(entry.results, outputs)
        return
    try:
        arguments = [_read(buffer, address) for buffer, address in zip(entry.operands, addresses)]
        _write(entry.results, outputs, entry.function(*arguments))
    except BaseException as e:  # noqa: BLE001 (re-raised by running(), never into compiled code)
        _zero(entry.results, outputs)
        if call is None:
            traceback.print_exc()
            return
        call.error = e
        call.text = f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exception(e)).strip()


def _failed() -> int:
    """Whether a callback of the thread's running program raised: its loops stop."""
    calls = _calls()
    return int(bool(calls) and calls[-1].error is not None)


def _read(buffer: _Buffer, address: int | None) -> np.ndarray:
    """A read-only copy of an operand: the buffer is the program's, gone after the call."""
    data = np.empty(buffer.shape, buffer.dtype)
    if buffer.nbytes:
        ctypes.memmove(data_address(data), address, buffer.nbytes)
    data.flags.writeable = False
    return data


def _write(buffers: Sequence[_Buffer], addresses: Sequence[int | None], values) -> None:
    values = tuple(values) if values is not None else ()
    if len(values) != len(buffers):
        raise RuntimeError(f"the callback returned {len(values)} values, the program expects {len(buffers)}")
    for i, (buffer, address, value) in enumerate(zip(buffers, addresses, values)):
        value = np.asarray(value)
        if value.shape != buffer.shape or value.dtype != buffer.dtype:
            raise RuntimeError(f"result {i} of the callback is {value.dtype}{list(value.shape)}, "
                               f"the program expects {buffer.dtype}{list(buffer.shape)}")
        if buffer.nbytes:
            value = np.ascontiguousarray(value)  # alive until copied: a copy when value is strided
            ctypes.memmove(address, data_address(value), buffer.nbytes)


def _zero(buffers: Sequence[_Buffer], addresses: Sequence[int | None]) -> None:
    """Results of a callback that failed or was skipped: defined values, not stale memory."""
    for buffer, address in zip(buffers, addresses):
        if buffer.nbytes:
            ctypes.memset(address, 0, buffer.nbytes)


# Alive as long as the process: compiled code holds their addresses.
_TRAMPOLINE = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)(_trampoline)
_FAILED = ctypes.CFUNCTYPE(ctypes.c_int32)(_failed)
TRAMPOLINE_ADDRESS: int = ctypes.cast(_TRAMPOLINE, ctypes.c_void_p).value
FAILED_ADDRESS: int = ctypes.cast(_FAILED, ctypes.c_void_p).value
