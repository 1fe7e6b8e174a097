"""The host target's last stages: loops, threads, vectors and memrefs -> LLVM dialect."""
from __future__ import annotations

import functools

from polyblocks_jax.cpu.target import host
from polyblocks_jax.options import Options
from polyblocks_jax.passes import Stage
from polyblocks_jax.passes.bool_buffers import widen_bool_buffers
from polyblocks_jax.passes.parallel import parallelize_loops


def cpu_stages(options: Options) -> list[Stage]:
    return [
        # Parallel iterators become scf.parallel, reduction dims scf.for; the matmul's
        # cache tiles (scf.forall) become scf.parallel too.
        Stage("loops", "func.func(convert-linalg-to-parallel-loops, scf-forall-to-parallel), canonicalize"),
        # One scf.parallel per large nest stays (its outermost); every other becomes scf.for.
        Stage("parallel", functools.partial(parallelize_loops, threads=host().cores)),
        Stage("bool-buffers", widen_bool_buffers),
        Stage("to-llvm",
              "convert-vector-to-scf, "
              # scf.parallel -> omp.parallel + omp.wsloop; its body sits in memref.alloca_scope,
              # which finalize-memref-to-llvm removes and convert-scf-to-cf cannot handle.
              "convert-scf-to-openmp, "
              # expand-strided-metadata emits affine.apply: lower affine after it.
              "expand-strided-metadata, lower-affine, finalize-memref-to-llvm, convert-scf-to-cf, "
              "convert-vector-to-llvm, "
              # math ops with an LLVM intrinsic first; the rest (erf, tan, ...) call libm.
              "convert-math-to-llvm, convert-math-to-libm, "
              # bf16 arithmetic in f32, and bf16 extf/truncf as integer ops: LLVM would
              # call __truncsfbf2, which the JIT cannot resolve.
              "func.func(arith-emulate-unsupported-floats{source-types=bf16 target-type=f32}, "
              "arith-expand{include-bf16=true}), "
              "convert-arith-to-llvm, convert-index-to-llvm, "
              "convert-cf-to-llvm, convert-openmp-to-llvm, convert-func-to-llvm, convert-ub-to-llvm, "
              "reconcile-unrealized-casts"),
    ]
