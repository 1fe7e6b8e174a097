"""LLVM's command-line options, set from Python: one registry per process, shared by MLIR's
printer, LLVM's optimizer and its code generators (host and NVPTX alike)."""
from __future__ import annotations

import ctypes
import functools
import os


@functools.cache
def _capi() -> ctypes.CDLL | None:
    import mlir._mlir_libs  # the compiler side only
    try:
        return ctypes.CDLL(os.path.join(os.path.dirname(mlir._mlir_libs.__file__), "libMLIRPythonCAPI.so"))
    except OSError:
        return None


@functools.cache
def set_options(*flags: str, register: str = "") -> bool:
    """Parse ``flags`` (``-name=value``) into LLVM's registry, once per process (an option may
    be given only once); ``register``: a C++ symbol registering the options first. False when
    this build of the bindings lacks either: defaults then stay, slower but still correct."""
    capi = _capi()
    try:
        if register:
            getattr(capi, register)()
        parse = capi.LLVMParseCommandLineOptions
    except AttributeError:
        return False
    args = [b"polyblocks_jax", *(f.encode() for f in flags)]
    parse(len(args), (ctypes.c_char_p * len(args))(*args), None)
    return True
