"""The PJRT_Api table: one ctypes callback per implemented function, in a PyCapsule.

Every callback catches everything: a Python exception escaping a ctypes callback would
return garbage that jaxlib reads as success. Functions we do not implement answer
UNIMPLEMENTED with their name. The table, its callbacks and everything they close over
are kept alive for the life of the process, since jaxlib destroys objects during
interpreter finalization, after module globals are gone.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import sys

from pypjrt._abi import pjrt_0_114 as abi

from polyblocks_jax.pjrt import errors, native
from polyblocks_jax.pjrt.device import host_device_count
from polyblocks_jax.pjrt.callbacks import IMPLEMENTATIONS, basics, buffer, client, device, executable  # noqa: F401

_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
CAPSULE_NAME = b"pjrt_c_api"
TRACE_ENV = "POLYBLOCKS_PJRT_TRACE"  # set to 1: print every callback's name (debugging)

_keep: list[object] = []  # the table and its callbacks; also leaked on purpose, see _immortal


# Destroy functions that jaxlib may call while a Python exception propagates: native.
NATIVE_DESTROY = ("PJRT_Buffer_Destroy", "PJRT_Event_Destroy", "PJRT_Error_Destroy",
                  "PJRT_Executable_Destroy", "PJRT_LoadedExecutable_Destroy")
# Counts that are 1 on a single host device, asked on every call: native too (a Python
# callback costs ~0.3 us); with several host devices, a program's own (Python).
NATIVE_ONE = ("PJRT_Executable_NumReplicas", "PJRT_Executable_NumPartitions")
# The per-call getters and Execute (native.GETTERS) are native where a handle's block answers
# them; Event_Error always is (events never carry errors).


def _wrap(name: str, args_type: type[ctypes.Structure], fn, natives: native.Native | None):
    from_address = args_type.from_address
    pending = natives.pending if natives is not None else None
    drain = natives.drain if natives is not None else None
    from_exception = errors.from_exception
    fallback = errors.FALLBACK_ERROR

    trace = name if os.environ.get(TRACE_ENV) else None

    def entry(address):
        try:
            if trace:
                print("pjrt:", trace, file=sys.stderr, flush=True)
            if pending is not None and pending.value:
                drain()  # release what jaxlib destroyed since the last callback
            fn(from_address(address))
            return None
        except BaseException as e:  # noqa: B036 (nothing may escape into jaxlib)
            try:
                return from_exception(e)
            except BaseException:  # noqa: B036
                return fallback
    entry.__name__ = name
    return _FN(entry)


def _unimplemented(name: str):
    exc = errors.unimplemented(name)
    from_exception = errors.from_exception
    trace = os.environ.get(TRACE_ENV)

    def entry(address):
        if trace:
            print("pjrt: (unimplemented)", name, file=sys.stderr, flush=True)
        return from_exception(exc)
    return _FN(entry)


def build_table() -> abi.PJRT_Api:
    api = abi.PJRT_Api()
    api.struct_size = abi.PJRT_Api_STRUCT_SIZE
    api.extension_start = None
    api.pjrt_api_version.struct_size = abi.PJRT_Api_Version_STRUCT_SIZE
    api.pjrt_api_version.major_version = abi.PJRT_API_MAJOR
    api.pjrt_api_version.minor_version = abi.PJRT_API_MINOR
    natives = native.load()
    addresses = {} if natives is None else {**dict.fromkeys(NATIVE_DESTROY, natives.destroy_address),
                                            **(dict.fromkeys(NATIVE_ONE, natives.one_address)
                                               if _one_host_device() else {}),
                                            "PJRT_Event_Error": natives.no_error_address}
    for name in abi.FUNCTIONS:
        if name in addresses:
            setattr(api, name, addresses[name])
            continue
        if name in IMPLEMENTATIONS:
            callback = _wrap(name, *IMPLEMENTATIONS[name], natives)
        else:
            callback = _unimplemented(name)
        _keep.append(callback)
        address = ctypes.cast(callback, ctypes.c_void_p).value
        if natives is not None and name in native.GETTERS:
            address = natives.getter(name, address)
        setattr(api, name, address)
    _keep.extend([api, natives])
    atexit.register(_native_teardown, api)
    return api


def _one_host_device() -> bool:
    try:
        return host_device_count() == 1
    except ValueError:  # reported when the client starts
        return True


def _native_teardown(api: abi.PJRT_Api) -> None:
    """At exit, point every Destroy/Delete slot at native code that returns NULL (success).

    jaxlib frees its arrays and executables while the interpreter finalizes; a callback
    entering Python then may find module globals gone, or (on another thread) be killed
    by the interpreter with pthread_exit, which aborts C++ code. Leaking at exit is free.
    ``sched_yield`` takes no arguments, has no effect worth noting and returns 0.
    """
    native_success = ctypes.cast(ctypes.CDLL(None).sched_yield, ctypes.c_void_p).value
    for name in abi.FUNCTIONS:
        if name.endswith(("_Destroy", "_Delete")):
            setattr(api, name, native_success)


def capsule() -> object:
    """A PyCapsule named "pjrt_c_api" holding the PJRT_Api*, as register_plugin expects."""
    api = build_table()
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    name = ctypes.create_string_buffer(CAPSULE_NAME)  # the capsule keeps this pointer
    _keep.append(name)
    _immortal(_keep)
    return new(ctypes.addressof(api), ctypes.addressof(name), None)


def _immortal(obj: object) -> None:
    """Leak one reference so the callbacks outlive module teardown at interpreter exit."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
