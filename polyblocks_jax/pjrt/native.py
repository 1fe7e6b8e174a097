"""Native PJRT functions (native.c), built once with ``cc`` and cached: the Destroy
functions, the constant answers and the getters of the per-call path.

Without a C compiler the plugin falls back to Python callbacks, which work (a little
slower) except when jaxlib destroys an array while an exception propagates.
"""
from __future__ import annotations

import ctypes
import logging
import os
import subprocess

from polyblocks_jax import native_build
from polyblocks_jax.pjrt import handles

logger = logging.getLogger(__name__)
_SOURCE = os.path.join(os.path.dirname(__file__), "native.c")
_BATCH = 256
# Getters answered from handle blocks (see handles.py), in the order of native.c's enum;
# a handle without the tag goes to the Python callback of the same PJRT function.
GETTERS = {
    "PJRT_Buffer_Device": "pb_buffer_device", "PJRT_Buffer_Memory": "pb_buffer_memory",
    "PJRT_Buffer_IsDeleted": "pb_buffer_is_deleted", "PJRT_Buffer_ReadyEvent": "pb_buffer_ready_event",
    "PJRT_Event_IsReady": "pb_event_is_ready", "PJRT_Event_OnReady": "pb_event_on_ready",
    "PJRT_Executable_NumOutputs": "pb_executable_num_outputs", "PJRT_Memory_Kind": "pb_memory_kind",
}


class Native:
    """The native functions' addresses, and the queue of handles jaxlib destroyed
    (``drain`` releases them from Python)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._library = library
        self.destroy_address = ctypes.cast(library.pb_defer_destroy, ctypes.c_void_p).value
        self.one_address = ctypes.cast(library.pb_one, ctypes.c_void_p).value  # sets a count to 1
        self.no_error_address = ctypes.cast(library.pb_no_error, ctypes.c_void_p).value  # Event_Error
        self.getter_addresses = {name: ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value
                                 for name, symbol in GETTERS.items()}
        self._python = (ctypes.c_void_p * len(GETTERS)).in_dll(library, "pb_python")
        self.pending = ctypes.c_size_t.in_dll(library, "pb_pending")
        self._take = library.pb_take
        self._take.restype, self._take.argtypes = ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_size_t]

    def getter(self, name: str, python_callback: int) -> int:
        """The native getter for PJRT function ``name``, asking ``python_callback`` (an
        address) about handles it cannot answer."""
        self._python[list(GETTERS).index(name)] = python_callback
        return self.getter_addresses[name]

    def drain(self) -> None:
        while self.pending.value:
            # A buffer per call: ctypes releases the GIL in pb_take, and threads drain at once.
            out = (ctypes.c_void_p * _BATCH)()
            count = self._take(out, _BATCH)
            for handle in out[:count]:
                obj = handles.LIVE.get(handle)
                if obj is None or getattr(obj, "immortal", False):
                    continue
                handles.release(handle)
                delete = getattr(obj, "delete", None)
                if delete is not None:
                    delete()


def load() -> Native | None:
    try:
        return Native(ctypes.CDLL(native_build.shared_library(_SOURCE, "native", ["-lpthread"])))
    except (OSError, subprocess.SubprocessError) as e:
        logger.warning("polyblocks PJRT: native functions unavailable (%s); using Python callbacks", e)
        return None
