"""A host executable: compiled code called through its raw pointer.

Two ways to get the code: the LLVM JIT (``jit``), or a shared library that an earlier
process built from the JIT's object file (``to_shared_library`` / ``from_shared_library``);
the latter needs neither MLIR nor LLVM, only ``dlopen``, so serialized executables load fast.

The C interface wrapper ``_mlir_ciface_main`` takes one pointer per argument, each to a
memref descriptor. The JIT reaches it through the engine's packed entry point (one
``void**`` whose slots point at the arguments); a shared library exposes it directly.
Outputs are out-parameters that we allocate, so no memory allocated by compiled code
crosses the boundary; an output computed in a donated input's buffer (``aliases``) has no
out-parameter: the entry takes the inputs, then the outputs that alias no input, then the
arena of the intermediates (``arena_bytes``, see passes/arena.py) when it has one. A call
takes an idle arena of the executable's or allocates one (so that two threads never share
one), checked: memory that cannot be had is a ResourceExhaustedError before the code runs;
it gives the arena back afterwards, so later calls find its pages mapped (tens of MiB that
the kernel would otherwise map and zero on every call).

Parallel loops call the LLVM OpenMP runtime (``libomp.so`` of the cmeel-libomp wheel):
the JIT loads it, a shared library links against it, and loading one makes it global
first, so its ``__kmpc_*`` references resolve wherever the library was built.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os
import subprocess
import tempfile
import threading
from typing import Callable, Iterable, Sequence

import numpy as np

from polyblocks_jax import dtypes
from polyblocks_jax.cpu.memref import DescriptorFactory, aligned_empty
from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.errors import CompilationError, ResourceExhaustedError
from polyblocks_jax.runtime.specs import check_arguments

_PACKED = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_ENTRY_SYMBOL = "_mlir_ciface_main"
_LINKER = os.environ.get("CC", "cc")


def build(llvm_module, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], options,
          aliases: Sequence[int | None] | None = None, overwritten: Iterable[int] = ()) -> "CpuExecutable":
    """JIT-compile an LLVM-dialect module (compiler side: needs MLIR) into a CpuExecutable."""
    from polyblocks_jax.passes.arena import arena_bytes
    return CpuExecutable(jit(llvm_module, options.opt_level), inputs, outputs, aliases, overwritten,
                         arena_bytes(llvm_module))


# LLVM code generation on large blocks of vector code (fused groups, unrolled copies) spends
# most of its time in two searches quadratic in a block's memory operations: the DAG
# combiner's merging of adjacent stores (our stores are whole vectors already) and the machine
# scheduler's dependence graph (bounded here as for its huge regions). ViT-Tiny: 57 -> 27 s.
# Loop strength reduction then took half of what was left on ResNet-18 (17 -> 10 s), in
# scalar evolution over unrolled register tiles whose addresses are constant offsets already;
# without it the models run as fast. Our kernels reach LLVM vectorized and with their
# register tiles unrolled: its loop vectorizer and its unrolling (at O3's threshold) then
# spent half of the optimizer's time finding little to do (ResNet-18: 11.5 -> 7.5 s, UNet
# 10 -> 7 s, no kernel slower).
_CODEGEN_OPTIONS = ("-combiner-store-merging=0", "-dag-maps-huge-region=100", "-disable-lsr",
                    "-vectorize-loops=false", "-unroll-threshold=50")


def jit(llvm_module, opt_level: int, shared_libs: Sequence[str] = ()):
    from mlir import execution_engine  # only the JIT path needs MLIR
    from polyblocks_jax import llvm_options
    llvm_options.set_options(*_CODEGEN_OPTIONS)
    # Position-independent code, so that the object file can become a shared library.
    return execution_engine.ExecutionEngine(llvm_module, opt_level=opt_level,
                                            shared_libs=[openmp_runtime(), *shared_libs],
                                            enable_object_dump=True, enable_pic=True)


@functools.cache
def openmp_runtime() -> str:
    """Path of the LLVM OpenMP runtime shipped by the cmeel-libomp wheel, loaded globally once."""
    try:
        path = str(importlib.metadata.distribution("cmeel-libomp").locate_file("cmeel.prefix/lib/libomp.so"))
    except importlib.metadata.PackageNotFoundError:
        raise CompilationError("openmp", "the cmeel-libomp package is not installed") from None
    if os.environ.get("OMP_NUM_THREADS", "unset").strip() == "":
        del os.environ["OMP_NUM_THREADS"]  # libomp aborts the process on an empty value
    ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    return path


class CpuExecutable:
    """Call with numpy arrays matching ``inputs``; returns a tuple of arrays matching ``outputs``.

    ``overwritten`` are the inputs whose memory the code may write (donated ones), and
    ``aliases[k]`` the input whose buffer holds output ``k`` (None: a fresh buffer). A call
    writes into such an input array (its contents are then undefined, or output ``k``,
    returned as that very array), unless the array is read-only or shares memory with
    another argument: then the code writes into a private copy. ``arena_bytes``: the size of
    the intermediates' arena, the entry's last argument (0: none).
    """

    def __init__(self, engine, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 aliases: Sequence[int | None] | None = None, overwritten: Iterable[int] = (),
                 arena_bytes: int = 0) -> None:
        self._owner = engine  # owns the code that _call points into
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.aliases: tuple[int | None, ...] = tuple(aliases) if aliases is not None else (None,) * len(outputs)
        self.overwritten = frozenset(overwritten) | {a for a in self.aliases if a is not None}
        fresh_outputs = [s for s, a in zip(self.outputs, self.aliases) if a is None]
        self.arena_bytes = arena_bytes
        self._idle_arenas: list[np.ndarray] = []
        self._arena_lock = threading.Lock()
        arena = [TensorSpec((arena_bytes,), dtypes.dtype("ui8"))] if arena_bytes else []
        self._factories = [DescriptorFactory(s) for s in self.inputs + fresh_outputs + arena]
        self._slots = len(self._factories)
        self._call: Callable[[list[int]], None] = (
            self._packed_caller(engine) if engine is not None else lambda addresses: None)

    def _packed_caller(self, engine) -> Callable[[list[int]], None]:
        address = engine.raw_lookup(_ENTRY_SYMBOL)
        if not address:  # the JIT printed which symbols it could not resolve
            raise CompilationError("jit", f"{_ENTRY_SYMBOL} could not be materialized")
        entry = _PACKED(address)
        slots, slot = self._slots, ctypes.sizeof(ctypes.c_void_p)

        def call(addresses: list[int]) -> None:
            pointers = (ctypes.c_void_p * slots)(*addresses)
            base = ctypes.addressof(pointers)
            entry((ctypes.c_void_p * slots)(*[base + i * slot for i in range(slots)]))
        return call

    def __call__(self, *arrays) -> tuple[np.ndarray, ...]:
        args = check_arguments(arrays, self.inputs)
        for i in self.overwritten:
            args[i] = _private_if_shared(args[i], [a for j, a in enumerate(args) if j != i])
        outs = [aligned_empty(spec.shape, spec.dtype.numpy) if a is None else args[a]
                for spec, a in zip(self.outputs, self.aliases)]
        self.run(args, outs)
        return tuple(outs)

    def run(self, args: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> None:
        """Execute into ``outs``; arrays C-contiguous with the right specs, an aliased output its input."""
        fresh = [o for o, a in zip(outs, self.aliases) if a is None]
        self.run_addresses([a.ctypes.data for a in (*args, *fresh)])

    def run_addresses(self, data: Sequence[int]) -> None:
        """``run`` on data addresses: the inputs, then the outputs that alias no input (the plugin's path)."""
        arena = self._take_arena() if self.arena_bytes else None
        try:
            addresses = [*data, arena.ctypes.data] if arena is not None else data
            descriptors = [make(address) for make, address in zip(self._factories, addresses)]
            self._call([ctypes.addressof(d) for d in descriptors])
        finally:
            if arena is not None:
                with self._arena_lock:
                    self._idle_arenas.append(arena)

    def _take_arena(self) -> np.ndarray:
        with self._arena_lock:
            if self._idle_arenas:
                return self._idle_arenas.pop()
        return _allocate_arena(self.arena_bytes)

    def to_shared_library(self) -> bytes:
        """The JIT's object code linked into a shared library (``cc -shared``), as bytes."""
        if not hasattr(self._owner, "dump_to_object_file"):
            raise CompilationError("serialize", "only a JIT-compiled executable can be serialized")
        with tempfile.TemporaryDirectory(prefix="polyblocks-") as tmp:
            obj, lib = os.path.join(tmp, "main.o"), os.path.join(tmp, "main.so")
            self._owner.dump_to_object_file(obj)
            runtime = os.path.dirname(openmp_runtime())
            done = subprocess.run([_LINKER, "-shared", "-o", lib, obj, "-lm", f"-L{runtime}", "-lomp",
                                   f"-Wl,-rpath,{runtime}"], capture_output=True, text=True)
            if done.returncode != 0:
                raise CompilationError("link", f"{_LINKER} -shared failed: {done.stderr.strip()}")
            with open(lib, "rb") as f:
                return f.read()

    @classmethod
    def from_shared_library(cls, library: bytes, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                            aliases: Sequence[int | None] | None = None,
                            overwritten: Iterable[int] = (), arena_bytes: int = 0) -> "CpuExecutable":
        """Load code made by ``to_shared_library``; the file is unlinked once mapped."""
        with tempfile.NamedTemporaryFile(prefix="polyblocks-", suffix=".so", delete=False) as f:
            f.write(library)
        openmp_runtime()  # global before the library loads, whatever rpath it carries
        try:
            dll = ctypes.CDLL(f.name, mode=os.RTLD_LOCAL)
        finally:
            os.unlink(f.name)
        exe = cls(None, inputs, outputs, aliases, overwritten, arena_bytes)
        exe._owner = dll
        entry = getattr(dll, _ENTRY_SYMBOL)
        entry.restype, entry.argtypes = None, [ctypes.c_void_p] * exe._slots
        exe._call = lambda addresses: entry(*addresses)
        return exe


def _private_if_shared(array: np.ndarray, others: Sequence[np.ndarray]) -> np.ndarray:
    """``array`` if the code may write into it, else a copy: never a read-only array, nor one
    whose memory another argument reads."""
    if array.flags.writeable and not any(np.may_share_memory(array, o) for o in others):
        return array
    return np.array(array, copy=True)


def _allocate_arena(size: int) -> np.ndarray:
    """The intermediates' memory for one call; compiled code never sees a failed allocation."""
    try:
        return aligned_empty((size,), np.dtype(np.uint8))
    except MemoryError:
        raise ResourceExhaustedError(f"the intermediates of this program need {size / (1 << 30):.2f} GiB "
                                     "at once, which this process cannot allocate") from None
