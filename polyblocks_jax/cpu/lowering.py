"""The host target's last stages: loops and memrefs -> LLVM dialect."""
from __future__ import annotations

from polyblocks_jax.options import Options
from polyblocks_jax.passes import Stage


def cpu_stages(options: Options) -> list[Stage]:
    return [
        Stage("to-llvm",
              "lower-affine, convert-scf-to-cf, "
              # math ops with an LLVM intrinsic first; the rest (erf, tan, ...) call libm.
              "convert-math-to-llvm, convert-math-to-libm, "
              "expand-strided-metadata, finalize-memref-to-llvm, convert-arith-to-llvm, "
              "convert-index-to-llvm, convert-cf-to-llvm, convert-func-to-llvm, "
              "reconcile-unrealized-casts"),
    ]
