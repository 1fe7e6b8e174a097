"""The host target's last stages: loops, vectors and memrefs -> LLVM dialect."""
from __future__ import annotations

from polyblocks_jax.options import Options
from polyblocks_jax.passes import Stage
from polyblocks_jax.passes.bool_buffers import widen_bool_buffers


def cpu_stages(options: Options) -> list[Stage]:
    return [
        Stage("loops", "func.func(convert-linalg-to-loops), canonicalize"),
        Stage("bool-buffers", widen_bool_buffers),
        Stage("to-llvm",
              "convert-vector-to-scf, "
              # expand-strided-metadata emits affine.apply: lower affine after it.
              "expand-strided-metadata, lower-affine, convert-scf-to-cf, "
              "convert-vector-to-llvm, "
              # math ops with an LLVM intrinsic first; the rest (erf, tan, ...) call libm.
              "convert-math-to-llvm, convert-math-to-libm, "
              # bf16 arithmetic in f32, and bf16 extf/truncf as integer ops: LLVM would
              # call __truncsfbf2, which the JIT cannot resolve.
              "func.func(arith-emulate-unsupported-floats{source-types=bf16 target-type=f32}, "
              "arith-expand{include-bf16=true}), "
              "finalize-memref-to-llvm, convert-arith-to-llvm, convert-index-to-llvm, "
              "convert-cf-to-llvm, convert-func-to-llvm, convert-ub-to-llvm, "
              "reconcile-unrealized-casts"),
    ]
