"""The host target's last stages: loops, threads, vectors and memrefs -> LLVM dialect."""
from __future__ import annotations

import functools

from mlir import ir
from mlir.dialects import func, scf

from polyblocks_jax.cpu.avx512_bf16 import round_computed_vectors
from polyblocks_jax.cpu.denormals import flush_denormals
from polyblocks_jax.cpu.carried_extrema import carry_extrema_as_integers
from polyblocks_jax.cpu.bf16 import (bf16_vectors_as_bits, bits_for_bf16_moves, define_truncsfbf2,
                                     emulate_bf16_arithmetic)
from polyblocks_jax.cpu.heap import check_heap_buffers
from polyblocks_jax.cpu.host_callbacks import define_host_callbacks
from polyblocks_jax.cpu.matrix_units import lower_matrix_units
from polyblocks_jax.cpu.outline import OUTLINED, bare_pointer, outline_kernels, outline_layer_kernels
from polyblocks_jax.cpu.prefetch import prefetch_next_tiles
from polyblocks_jax.cpu.signed_zeros import extrema_as_x86_selects
from polyblocks_jax.cpu.target import host
from polyblocks_jax.cpu.part_copies import fold_part_copies
from polyblocks_jax.cpu.vector_copies import vectorize_copies
from polyblocks_jax.options import Options
from polyblocks_jax.passes import INLINE_LAYERS, VECTOR_TRANSFERS, Stage
from polyblocks_jax.cpu.arena import plan_arena
from polyblocks_jax.passes.bool_buffers import widen_bool_buffers
from polyblocks_jax.cpu.iteration_buffers import hoist_iteration_buffers
from polyblocks_jax.cpu.packed_entry import add_packed_entry
from polyblocks_jax.cpu.parallel import parallelize_loops
from polyblocks_jax.cpu.parallel_constants import clone_vectors_into_parallel_loops
from polyblocks_jax.cpu.parallel_if import guard_parallel_regions, region_works
from polyblocks_jax.contexts import pass_manager
from polyblocks_jax.cpu.interleaved_writes import interleave_part_writes
from polyblocks_jax.cpu.vector_reads import lower_vector_reads


def cpu_stages(options: Options, small: bool = False) -> list[Stage]:
    """The host's stages for ``options``; ``small``: a program of the fast tier (passes/work.py),
    whose data stays in cache (no prefetching) and whose one function stays small for LLVM
    (its loop nests not outlined)."""
    vectors = [Stage("copy-vectors", _vectorize_copies)] if options.vectorize else []
    # After the parallel stage: the loop over a parallel iteration's tiles is final there.
    # The host rounds f32 vectors to bf16 in one instruction (avx512_bf16.py).
    roundings = [Stage("vector-bf16-rounding", round_computed_vectors)
                 ] if options.vectorize and host().has_avx512_bf16 else []
    prefetches = [Stage("prefetch", functools.partial(prefetch_next_tiles, l1_bytes=host().l1d_bytes))
                  ] if options.prefetch and not small else []
    # One function per top-level loop nest: LLVM's OpenMP outlining and optimizer then
    # work on small functions, not on one function holding the whole model.
    outlines = [] if small else [Stage("outline", outline_kernels)]
    return [
        # Packed contractions marked for a matrix unit become AMX / VDPBF16PS kernels.
        Stage("unit-kernels", lower_matrix_units),
        *vectors,
        # Parallel iterators become scf.parallel, reduction dims scf.for; the matmul's
        # cache tiles (scf.forall) become scf.parallel too.
        Stage("loops", "func.func(convert-linalg-to-parallel-loops, scf-forall-to-parallel), canonicalize"),
        # One scf.parallel per large nest stays (its outermost); every other becomes scf.for.
        Stage("parallel", functools.partial(parallelize_loops, threads=host().cores)),
        *prefetches,
        # Calls back into Python: after the parallel stage, which they must stay out of.
        Stage("host-callbacks", define_host_callbacks),
        Stage("bool-buffers", widen_bool_buffers),
        Stage("bf16-bits", bits_for_bf16_moves),
        # A parallel loop's large buffers (packing): one slot per iteration, before the loop.
        Stage("iteration-buffers", functools.partial(hoist_iteration_buffers, threads=host().cores)),
        # A shared layer's loop nests become kernels once, called by each of its copies
        # (ViT-Tiny: 565 kernels outlined one by one before, 0.3 s).
        Stage("outline-layers", outline_layer_kernels),
        # The stages above ran on each shared layer once; those below work on main alone.
        INLINE_LAYERS,
        # The top level's intermediates: views of one arena the runtime allocates per call.
        Stage("arena", plan_arena),
        # An intermediate that can never be allocated: an error now, not a NULL store later.
        Stage("heap-limit", check_heap_buffers),
        # Vectors a parallel loop reads, made of constants and scalars, cloned into it: the
        # kernel and OpenMP outlining would pass them through memory, where they no longer fold.
        Stage("parallel-constants", clone_vectors_into_parallel_loops),
        *outlines,
        # A gather from a strided view (a column) reads a contiguous span: LLVM's gather needs
        # unit stride. A vector read of one element (a broadcast map) is one load: the
        # transfer lowering would load it once per lane.
        Stage("vector-reads", lower_vector_reads),
        # A complex result's parts, each a strided vector write, as one interleaved store.
        Stage("interleaved-writes", interleave_part_writes),
        VECTOR_TRANSFERS,
        # bf16 arithmetic in f32, each result rounded to bf16 (the pass in to-llvm would
        # let a product reach an add unrounded).
        Stage("bf16-arithmetic", emulate_bf16_arithmetic),
        *roundings,
        # A loop's max/min reduction as integer extrema of the elements' bits, the float
        # recovered after the loop (see cpu/carried_extrema.py).
        Stage("carried-extrema", carry_extrema_as_integers),
        # Float max and min as single MAXPS/MINPS selects (see cpu/signed_zeros.py).
        Stage("x86-extrema", extrema_as_x86_selects),
        # Denormals are zero while main runs (as on XLA CPU; arithmetic on them is slow).
        Stage("flush-denormals", flush_denormals),
        # Conversions that work function by function are nested in func.func: MLIR runs them
        # on the outlined kernels in parallel, one per core.
        Stage("to-llvm", lower_to_llvm, verify=False),
        # Memory is pointers now: bf16 vectors move as i16 ones, which llc splits at any length.
        Stage("bf16-vector-bits", bf16_vectors_as_bits),
        # A function parsed into the module: verifying all of it again cost 12 ms a model.
        Stage("bf16-rounding", define_truncsfbf2, verify=False),
    ]


def _vectorize_copies(module: ir.Module, options: Options) -> bool:
    lanes = host().vector_bits // 32
    # Copies into a complex buffer's part first: they join the loops writing the other part.
    folded = fold_part_copies(module, lanes)
    return vectorize_copies(module, lanes) or folded


# scf.parallel -> omp.parallel + omp.wsloop; its body sits in memref.alloca_scope,
# which finalize-memref-to-llvm removes and convert-scf-to-cf cannot handle. (No n-D
# transfer is left to convert-vector-to-scf: the vector-transfers stage unrolled them.)
_TO_OPENMP = "convert-scf-to-openmp"
_TO_LLVM = (
    # expand-strided-metadata emits affine.apply: lower affine after it.
    "func.func(expand-strided-metadata, lower-affine), finalize-memref-to-llvm, "
    # bf16 math in f32 (see cpu/bf16.py). Then math ops with an LLVM intrinsic;
    # the rest (erf, cbrt, ...) call libm, one call per lane of a vector (vector
    # extracts and inserts, hence before the vector lowering).
    "func.func(convert-scf-to-cf, math-extend-to-supported-types{extra-types=f16 target-type=f32}, "
    "convert-math-to-llvm), convert-math-to-libm, "
    # enable-amx / enable-x86vector: amx.* and x86vector.* ops to their intrinsics.
    "func.func(convert-vector-to-llvm{enable-amx enable-x86vector}, "
    # bf16 arithmetic in f32, and bf16 extf/truncf as integer ops: LLVM would
    # call __truncsfbf2, which our library does not link.
    "arith-emulate-unsupported-floats{source-types=bf16 target-type=f32}, "
    "arith-expand{include-bf16=true}, convert-arith-to-llvm, convert-index-to-llvm, "
    # cf through convert-to-llvm: its type converter also knows AMX tiles (carried
    # by the AMX kernel's k loop), convert-cf-to-llvm's does not. ub (the poison vectors
    # are built from) here too, function by function in parallel: convert-ub-to-llvm on
    # the module walked it all on one thread (ViT-Tiny's to-llvm 9% faster, ResNet-18's
    # 6%, the LLVM IR the same).
    "convert-to-llvm{filter-dialects=cf,amx,ub}), ")
# Functions, then what is left. convert-openmp-to-llvm converts functions too (with memref
# descriptors): the bare-pointer convention has to come first.
_BARE_FUNCTIONS = "convert-func-to-llvm{use-bare-ptr-memref-call-conv=1}, convert-openmp-to-llvm, "
_DESCRIPTOR_FUNCTIONS = "convert-openmp-to-llvm, convert-func-to-llvm, "
_REST = "reconcile-unrealized-casts"


def _scopes_in_blocks_of_their_own(module: ir.Module) -> None:
    """Put each memref.alloca_scope that lies right in an scf op's region (an AMX kernel whose
    parallel loop had one step, folded away, in a scan's body) into an scf.execute_region:
    finalize-memref-to-llvm splits the scope's block into several, which an scf.while or
    scf.for region may not hold (convert-scf-to-cf then aborted on a terminator that was not
    scf.yield); an execute_region's may, and convert-scf-to-cf inlines it."""
    scopes = []
    module.operation.walk(lambda op: (scopes.append(op) if op.name == "memref.alloca_scope"
                                      and op.parent.name.startswith("scf.")
                                      and op.parent.name != "scf.execute_region" else None,
                                      ir.WalkResult.ADVANCE)[1])
    for scope in scopes:
        with ir.InsertionPoint(scope), scope.location:
            region_op = scf.ExecuteRegionOp([r.type for r in scope.results])
            block = region_op.region.blocks.append()
        for old, new in zip(scope.results, region_op.results):
            old.replace_all_uses_with(new)
        with ir.InsertionPoint(block), scope.location:
            yield_op = scf.YieldOp(list(scope.results))
        scope.move_before(yield_op)


def lower_to_llvm(module: ir.Module, options: Options) -> None:
    """The module in the LLVM dialect. Its functions take bare pointers where every
    function's buffers allow it (cpu/outline.py's ``bare_pointer``), memref descriptors
    otherwise: a call and its callee must agree (cpu/executable.py reads which from the
    library)."""
    functions = [op for op in module.body.operations if isinstance(op, func.FuncOp)]
    bare = all(bare_pointer(t) for f in functions for t in [*f.type.inputs, *f.type.results])
    works = region_works(module)
    pass_manager(f"builtin.module({_TO_OPENMP})", module.context).run(module.operation)
    _scopes_in_blocks_of_their_own(module)
    guard_parallel_regions(module, works)
    pipeline = _TO_LLVM + (_BARE_FUNCTIONS if bare else _DESCRIPTOR_FUNCTIONS) + _REST
    pass_manager(f"builtin.module({pipeline})", module.context).run(module.operation)
    if bare:
        add_packed_entry(module)
    # The lowering builds a memref descriptor for every view main passes to a kernel, then
    # takes one pointer out of it: folded here, not by LLVM (in a model's main, most of its
    # lines of IR and a large share of the module's text). The kernels hold
    # few such chains; canonicalizing them too cost more than LLVM saved.
    cleanup = pass_manager("llvm.func(canonicalize)", module.context)
    for function in module.body.operations:
        if function.operation.name == "llvm.func" and OUTLINED not in function.attributes:
            cleanup.run(function.operation)
