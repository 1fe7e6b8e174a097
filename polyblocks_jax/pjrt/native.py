"""Native PJRT functions (native.c), built once with ``cc`` and cached: the Destroy
functions, the constant answers, the getters and Execute of the per-call path.

Native Execute runs a host program whose loaded executable has a plan (``Native.plan``)
and makes its output buffers in C; Python adopts such a buffer (``Native.adopt``) when a
callback first names it, as a Buffer over that memory, which C frees once numpy lets go.
What a donating native Execute leaves to Python comes through the queue of destroyed
handles, tagged in the low bits: buffers of Python's to delete (their handles stay jaxlib's),
and memory lent to outputs made in C (``_lent``, until C returns it or Python adopts the output).

Without a C compiler the plugin falls back to Python callbacks, which work (slower)
except when jaxlib destroys an array while an exception propagates.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
import subprocess
import threading
import weakref

import numpy as np

from polyblocks_jax import native_build
from polyblocks_jax.cpu import executable as cpu_executable
from polyblocks_jax.cpu.array_pool import MIN_BYTES
from polyblocks_jax.pjrt import handles
from polyblocks_jax.pjrt.buffer import NUMPY_OF_TYPE, Buffer
from polyblocks_jax.pjrt.events import READY
from polyblocks_jax.runtime.foreign_memory import array_type, bytes_at

logger = logging.getLogger(__name__)
_SOURCE = os.path.join(os.path.dirname(__file__), "native.c")
_BATCH = 256
# Functions answered in C from handle blocks (see handles.py): the getters and Execute, in the
# order of native.c's enum; a handle without the tag (or a call C does not take) goes to the
# Python callback of the same PJRT function.
GETTERS = {
    "PJRT_Buffer_Device": "pb_buffer_device", "PJRT_Buffer_Memory": "pb_buffer_memory",
    "PJRT_Buffer_IsDeleted": "pb_buffer_is_deleted", "PJRT_Buffer_ReadyEvent": "pb_buffer_ready_event",
    "PJRT_Event_IsReady": "pb_event_is_ready", "PJRT_Event_OnReady": "pb_event_on_ready",
    "PJRT_Executable_NumOutputs": "pb_executable_num_outputs", "PJRT_Memory_Kind": "pb_memory_kind",
    "PJRT_LoadedExecutable_Execute": "pb_execute",
}
_MADE_IN_C, _BORROWED = 0x70620010, 0x70620012  # a buffer block's origin word (native.c)
_ORIGIN_WORD = 7
_CONSUMED, _LENT, _RETURNED = 1, 2, 3  # tags of a queue entry's low bits (native.c)


class _Output(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("rank", ctypes.c_int32), ("nbytes", ctypes.c_size_t),
                ("dims", ctypes.c_void_p), ("alias", ctypes.c_int64)]


_DONATED, _OVERWRITTEN = 1, 2  # an input's flags (native.c)


class _Input(ctypes.Structure):
    _fields_ = [("nbytes", ctypes.c_size_t), ("flags", ctypes.c_int64)]


class _Plan(ctypes.Structure):
    """What native Execute needs of a loaded executable (native.c's Plan)."""
    _fields_ = [("entry", ctypes.c_void_p), ("packed", ctypes.c_int64), ("device", ctypes.c_void_p),
                ("memory", ctypes.c_void_p),
                ("ready_event", ctypes.c_void_p), ("num_inputs", ctypes.c_size_t), ("num_outputs", ctypes.c_size_t),
                ("arena_bytes", ctypes.c_size_t), ("idle_arena", ctypes.c_void_p), ("outputs", ctypes.c_void_p),
                ("inputs", ctypes.c_void_p)]


class _NativeBuffer(ctypes.Structure):
    """A buffer block that native Execute made; its dims follow."""
    _fields_ = [("words", ctypes.c_size_t * 8), ("type", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("nbytes", ctypes.c_size_t)]


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
        self.max_pointers = ctypes.c_size_t.in_dll(library, "pb_max_pointers").value
        ctypes.c_size_t.in_dll(library, "pb_pool_min").value = MIN_BYTES
        for name, restype in (("pb_free", None), ("pb_adopted", None), ("pb_new_plan", ctypes.c_void_p),
                              ("pb_free_plan", None)):
            function = getattr(library, name)
            function.restype, function.argtypes = restype, [ctypes.c_void_p]
        self._free, self._adopted_in_c = library.pb_free, library.pb_adopted
        self._give_back = library.pb_give_back  # an output's memory: to C's pool or freed
        self._give_back.restype, self._give_back.argtypes = None, [ctypes.c_void_p, ctypes.c_size_t]
        self._new_plan, self._free_plan = library.pb_new_plan, library.pb_free_plan
        self._before_call = ctypes.c_void_p.in_dll(library, "pb_before_call")
        self._adopted: set[int] = set()  # blocks made in C that Python frees once jaxlib destroys them
        # data address -> (array, on_release) of a buffer whose memory an output made in C holds
        self._lent: dict[int, tuple[np.ndarray, object]] = {}
        self._adopt_lock = threading.Lock()
        handles.LIVE.adopt = self.adopt

    def getter(self, name: str, python_callback: int) -> int:
        """The native getter for PJRT function ``name``, asking ``python_callback`` (an
        address) about handles it cannot answer."""
        self._python[list(GETTERS).index(name)] = python_callback
        return self.getter_addresses[name]

    def drain(self) -> None:
        while self.pending.value:
            # A buffer per call: ctypes releases the GIL in pb_take, and threads drain at once.
            out = array_type(ctypes.c_void_p, _BATCH)()
            count = self._take(out, _BATCH)
            for handle in out[:count]:
                if handle and handle & 3:
                    self._settle(handle & ~3, handle & 3)
                    continue
                obj = handles.LIVE.get(handle)
                if obj is None or getattr(obj, "immortal", False):
                    continue
                handles.release(handle)
                delete = getattr(obj, "delete", None)
                if delete is not None:
                    delete()
                if handle in self._adopted:
                    self._adopted.discard(handle)
                    self._free(handle)

    def _settle(self, address: int, tag: int) -> None:
        """What a donating native Execute left: a consumed or lent buffer, or returned memory."""
        if tag == _RETURNED:
            array, on_release = self._lent.pop(address)
            if on_release is not None:
                on_release()
            return
        buffer = handles.LIVE.get(address)  # a consumed buffer's handle stays jaxlib's
        if tag == _LENT:
            self._lent[buffer.address] = (buffer.array, buffer.on_release)
            buffer.on_release = None  # fired when the memory comes back
        buffer.delete()

    def plan(self, loaded) -> tuple[int, object]:
        """The address of native Execute's plan for ``loaded`` (0: Python runs its calls), and
        what must live as long as the plan; freed with ``loaded``.

        Native Execute takes a program on the host with no token outputs, an entry of bare
        pointers (no host callbacks, not a descriptor entry): the packed entry, or where the
        library has none, the bare one if its pointers are within native.c's count. Its
        donated and written inputs go into the plan's inputs.
        """
        exe = loaded.executable
        entry = getattr(exe.compiled, "entry_address", None)  # code called in this process: the host's
        if entry is None or exe.token_outputs:
            return 0, None
        packed = getattr(exe.compiled, "packed_entry_address", None)
        pointers = exe.num_inputs + exe.num_outputs + (1 if exe.compiled.arena_bytes else 0)
        if packed is None and pointers > self.max_pointers:
            return 0, None
        outputs = array_type(_Output, max(exe.num_outputs, 1))()
        dims = ctypes.addressof(exe.output_dims)  # every output's dims, one after another
        for output, spec, code, alias in zip(outputs, exe.compiled.outputs, exe.output_types, exe.aliases):
            output.type, output.rank, output.nbytes, output.dims = code, spec.rank, spec.nbytes, dims
            output.alias = -1 if alias is None else alias
            dims += spec.rank * ctypes.sizeof(ctypes.c_int64)
        inputs = None
        if exe.donated or exe.overwritten:
            inputs = array_type(_Input, exe.num_inputs)()
            for i, (field, spec) in enumerate(zip(inputs, exe.compiled.inputs)):
                field.nbytes = spec.nbytes
                field.flags = _DONATED * (i in exe.donated) + _OVERWRITTEN * (i in exe.overwritten)
        fields = _Plan(entry if packed is None else packed, packed is not None, loaded.device.handle,
                       loaded.device.memory.handle, READY, exe.num_inputs, exe.num_outputs,
                       exe.compiled.arena_bytes, None, ctypes.addressof(outputs),
                       ctypes.addressof(inputs) if inputs is not None else None)
        self._before_call.value = cpu_executable.teams_policy_address()  # libomp is loaded by now
        address = self._new_plan(ctypes.addressof(fields))
        if not address:
            return 0, None
        weakref.finalize(loaded, self._free_plan, address).atexit = False  # at exit a call may still run
        return address, (outputs, inputs)

    def adopt(self, handle: int) -> Buffer | None:
        """The Buffer of a block that native Execute made, registered under that handle; None
        for any other unknown handle."""
        origin = handles.word(handle, _ORIGIN_WORD)
        if handles.word(handle, 1) != handles.BUFFER or origin not in (_MADE_IN_C, _BORROWED):
            return None
        with self._adopt_lock:  # two threads may name one new buffer at once
            known = dict.get(handles.LIVE, handle)
            if known is not None:
                return known
            block = _NativeBuffer.from_address(handle)
            dims = tuple(array_type(ctypes.c_int64, block.rank).from_address(handle + ctypes.sizeof(_NativeBuffer)))
            dtype, data = NUMPY_OF_TYPE[block.type], block.words[6]
            device = handles.LIVE[block.words[2]]
            if block.words[handles.DELETED_WORD]:  # donated to a native call, which took its memory
                buffer = Buffer(np.broadcast_to(np.zeros((), dtype), dims), device, address=0, handle=handle)
                buffer.delete()
            elif origin == _BORROWED:  # the lent memory's array is this buffer's now
                array, on_release = self._lent.pop(data)
                buffer = Buffer(array.view(dtype).reshape(dims), device, on_release, handle=handle)
            else:
                memory = bytes_at(data, max(block.nbytes, 1))
                weakref.finalize(memory.base, self._give_back, data, block.nbytes).atexit = False  # once no array views it
                buffer = Buffer(np.ndarray(dims, dtype, buffer=memory), device, handle=handle)
            self._adopted_in_c(handle)
            self._adopted.add(handle)
            return buffer


@functools.cache
def load() -> Native | None:
    try:
        return Native(ctypes.CDLL(native_build.shared_library(_SOURCE, "native", ["-lpthread"])))
    except (OSError, subprocess.SubprocessError) as e:
        logger.warning("polyblocks PJRT: native functions unavailable (%s); using Python callbacks", e)
        return None
