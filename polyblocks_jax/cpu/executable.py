"""A host executable: a shared library of compiled code, called through its entry point.

``cpu.compile.build`` makes the library (cpu/codegen.py: LLVM, one thread per part of the
module); a serialized executable carries the same bytes, so loading one needs neither MLIR
nor LLVM, only ``dlopen``.

The entry ``main`` takes one pointer per argument, to its data: the host's buffers have
static shapes and contiguous layouts, so LLVM functions take bare pointers, not memref
descriptors (5 to 9 words per buffer passed to each kernel, and a C wrapper unpacking
them, all of which LLVM must compile). A library
whose functions keep descriptors (a buffer of no elements, the deallocation helper's
dynamic ones; and those of serialized formats 2 and 3) exports the C wrapper
``_mlir_ciface_main`` instead, one pointer per argument to a descriptor: its presence says
which. Outputs are out-parameters that we allocate, so no memory allocated by
compiled code crosses the boundary; an output computed in a donated input's buffer
(``aliases``) has no out-parameter: the entry takes the inputs, then the outputs that alias
no input, then the arena of the intermediates (``arena_bytes``, see cpu/arena.py) when it
has one. A call takes an idle arena of the executable's or allocates one (so that two
threads never share one), checked: memory that cannot be had is a ResourceExhaustedError
before the code runs; it gives the arena back afterwards, so later calls find its pages
mapped (tens of MiB that the kernel would otherwise map and zero on every call).

Parallel loops call the LLVM OpenMP runtime (``libomp.so`` of the cmeel-libomp wheel): the
library links against it, and loading it globally first makes its ``__kmpc_*`` references
resolve wherever the library was built.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import logging
import os
import subprocess
import tempfile
import threading
from typing import Iterable, Sequence

import numpy as np

from polyblocks_jax import dtypes, native_build
from polyblocks_jax.cpu.array_pool import data_address
from polyblocks_jax.cpu.memref import DescriptorFactory, aligned_empty
from polyblocks_jax.dtypes import TensorSpec
from polyblocks_jax.errors import CompilationError, ResourceExhaustedError
from polyblocks_jax.runtime.specs import check_arguments

logger = logging.getLogger(__name__)
_BARE_ENTRY = "main"
PACKED_ENTRY = "polyblocks_main_packed"  # cpu/packed_entry.py's
_DESCRIPTOR_ENTRY = "_mlir_ciface_main"


DYNAMIC_TEAMS = {"OMP_DYNAMIC": "true", "KMP_DYNAMIC_MODE": "load_balance"}


@functools.cache
def openmp_runtime() -> str:
    """Path of the LLVM OpenMP runtime shipped by the cmeel-libomp wheel, loaded globally once."""
    try:
        path = str(importlib.metadata.distribution("cmeel-libomp").locate_file("cmeel.prefix/lib/libomp.so"))
    except importlib.metadata.PackageNotFoundError:
        raise CompilationError("openmp", "the cmeel-libomp package is not installed") from None
    if os.environ.get("OMP_NUM_THREADS", "unset").strip() == "":
        del os.environ["OMP_NUM_THREADS"]  # libomp aborts the process on an empty value
    # A parallel region ends when its last thread does: where other processes also use the
    # cores, a descheduled thread holds every region for a time slice. libomp's load-balance
    # mode sizes each team to the cores idle at that moment (sampled at most once a second);
    # read when the runtime initializes, at the first parallel region. Where the machine is
    # busier than that, teams.c takes over before each call. A user's setting wins.
    users = any(name in os.environ for name in (*DYNAMIC_TEAMS, "KMP_BLOCKTIME"))
    for name, value in DYNAMIC_TEAMS.items():
        os.environ.setdefault(name, value)
    ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    if not users:
        _load_teams_policy()
    return path


# The library global (an address) through which compiled code reads teams.c's
# pb_min_parallel_work before each parallel region (cpu/parallel_if.py).
MIN_WORK_SYMBOL = "polyblocks_parallel_min_work"
# Estimated work (cpu/parallel.py's units) below which a region runs on the calling thread
# when the machine is busy: a sleeping worker's wake-up (5-15 us) plus a share of a busy core
# repay only regions of some 100 us and more (the zoo's GRU at batch 8, busy: 3.6 ms with
# this bound, 7.7 with 2^22 and up, 15 with every region parallel).
BUSY_MIN_PARALLEL_WORK = 1 << 21


def _no_policy() -> None:
    pass


choose_teams = _no_policy  # called before each call of compiled code: see teams.c
_min_work_address = 0  # of teams.c's pb_min_parallel_work where the policy is in use


def teams_policy_address() -> int | None:
    """The address of teams.c's ``pb_teams_choose`` where it is in use, for native callers."""
    policy = choose_teams
    return None if policy is _no_policy else ctypes.cast(policy, ctypes.c_void_p).value


def _load_teams_policy() -> None:
    global choose_teams, _min_work_address
    try:
        library = ctypes.CDLL(native_build.shared_library(os.path.join(os.path.dirname(__file__), "teams.c"), "teams"))
    except (OSError, subprocess.SubprocessError) as e:  # no C compiler: libomp's teams alone
        logger.info("polyblocks: no policy for parallel teams under load (%s)", e)
        return
    from polyblocks_jax.cpu.target import host
    library.pb_teams_init.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_char_p]
    library.pb_teams_init(host().cores, 200, BUSY_MIN_PARALLEL_WORK, b"/proc/loadavg")
    choose_teams = library.pb_teams_choose
    choose_teams.restype, choose_teams.argtypes = None, []
    _min_work_address = ctypes.addressof(ctypes.c_longlong.in_dll(library, "pb_min_parallel_work"))


class CpuExecutable:
    """Call with numpy arrays matching ``inputs``; returns a tuple of arrays matching ``outputs``.

    ``overwritten`` are the inputs whose memory the code may write (donated ones), and
    ``aliases[k]`` the input whose buffer holds output ``k`` (None: a fresh buffer). A call
    writes into such an input array (its contents are then undefined, or output ``k``,
    returned as that very array), unless the array is read-only or shares memory with
    another argument: then the code writes into a private copy. ``arena_bytes``: the size of
    the intermediates' arena, the entry's last argument (0: none). ``descriptors``: whether
    the entry takes memref descriptors (the library's C wrapper), not bare pointers.
    """

    def __init__(self, library: bytes, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 aliases: Sequence[int | None] | None = None, overwritten: Iterable[int] = (),
                 arena_bytes: int = 0) -> None:
        self.library = library
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.aliases: tuple[int | None, ...] = tuple(aliases) if aliases is not None else (None,) * len(outputs)
        self.overwritten = frozenset(overwritten) | {a for a in self.aliases if a is not None}
        fresh_outputs = [s for s, a in zip(self.outputs, self.aliases) if a is None]
        self.arena_bytes = arena_bytes
        self._idle_arenas: list[np.ndarray] = []
        self._arena_lock = threading.Lock()
        arena = [TensorSpec((arena_bytes,), dtypes.dtype("ui8"))] if arena_bytes else []
        self._specs = self.inputs + fresh_outputs + arena
        self._load_lock = threading.Lock()
        self._dll: ctypes.CDLL | None = None  # owns the code that _entry points into
        self._globals: dict[str, int] = {}  # set_global's values, written at load

    def load(self) -> None:
        """``dlopen`` the library, once: at the first call, unless done before. A compile
        worker builds executables only to send their bytes, and never loads them."""
        with self._load_lock:
            if self._dll is not None:
                return
            dll = _load(self.library)
            self._descriptors = hasattr(dll, _DESCRIPTOR_ENTRY)
            self._factories = [DescriptorFactory(s) for s in self._specs] if self._descriptors else None
            self._entry = getattr(dll, _DESCRIPTOR_ENTRY if self._descriptors else _BARE_ENTRY)
            self._entry.restype, self._entry.argtypes = None, [ctypes.c_void_p] * len(self._specs)
            if hasattr(dll, MIN_WORK_SYMBOL):
                ctypes.c_int64.in_dll(dll, MIN_WORK_SYMBOL).value = _min_work_address
            for symbol, value in self._globals.items():
                ctypes.c_int64.in_dll(dll, symbol).value = value
            self._dll = dll

    @property
    def descriptors(self) -> bool:
        self.load()
        return self._descriptors

    @property
    def packed_entry_address(self) -> int | None:
        """Address of the entry that takes one pointer to the bare entry's arguments
        (cpu/packed_entry.py); None where the library has none."""
        self.load()
        packed = getattr(self._dll, PACKED_ENTRY, None)
        return None if packed is None else ctypes.cast(packed, ctypes.c_void_p).value

    @property
    def entry_address(self) -> int | None:
        """Address of the entry of bare pointers (inputs, fresh outputs, arena); None for a descriptor entry."""
        return None if self.descriptors else ctypes.cast(self._entry, ctypes.c_void_p).value

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
        self.run_addresses([data_address(a) for a in (*args, *fresh)])

    def run_addresses(self, data: Sequence[int]) -> None:
        """``run`` on data addresses: the inputs, then the outputs that alias no input (the plugin's path)."""
        if self._dll is None:
            self.load()
        arena = self._take_arena() if self.arena_bytes else None
        choose_teams()
        try:
            addresses = [*data, data_address(arena)] if arena is not None else data
            if self._factories is None:
                self._entry(*addresses)
            else:
                descriptors = [make(address) for make, address in zip(self._factories, addresses)]
                self._entry(*[ctypes.addressof(d) for d in descriptors])
        finally:
            if arena is not None:
                with self._arena_lock:
                    self._idle_arenas.append(arena)

    def set_global(self, symbol: str, value: int) -> None:
        """Give the library's 64-bit global ``symbol`` (an address the code calls) ``value``,
        now if the library is loaded, else when it loads."""
        with self._load_lock:
            self._globals[symbol] = value
            if self._dll is not None:
                ctypes.c_int64.in_dll(self._dll, symbol).value = value

    def _take_arena(self) -> np.ndarray:
        with self._arena_lock:
            if self._idle_arenas:
                return self._idle_arenas.pop()
        return _allocate_arena(self.arena_bytes)


def _load(library: bytes) -> ctypes.CDLL:
    """``dlopen`` of ``library``'s bytes; the file is unlinked once mapped."""
    with tempfile.NamedTemporaryFile(prefix="polyblocks-", suffix=".so", delete=False) as f:
        f.write(library)
    openmp_runtime()  # global before the library loads, whatever rpath it carries
    try:
        return ctypes.CDLL(f.name, mode=os.RTLD_LOCAL)
    except OSError as e:
        raise CompilationError("load", f"the compiled library does not load: {e}") from None
    finally:
        os.unlink(f.name)


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
