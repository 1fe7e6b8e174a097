"""Vectors of constants and scalars that a parallel loop reads from outside, cloned into it
(cpu/parallel_constants.py), and recomputed by the kernels outlining makes (cpu/outline.py):
on IR, then a program against XLA."""
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from mlir import ir

import polyblocks_jax as pb
import support
from polyblocks_jax.cpu import outline
from polyblocks_jax.cpu.parallel_constants import clone_vectors_into_parallel_loops
from polyblocks_jax.passes.transform import walk

# A mask built from the lanes' indices and a scalar, read by a parallel loop over rows with
# a constant vector and a vector loaded from memory (which must stay outside).
_MASKED_ROWS = """
func.func @main(%a: memref<16x8xf32>, %j: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %zero = arith.constant dense<0.0> : vector<8xf32>
  %poison = ub.poison : f32
  %lanes = vector.step : vector<8xindex>
  %first = vector.transfer_read %a[%c0, %c0], %poison {in_bounds = [true]} : memref<16x8xf32>, vector<8xf32>
  %splat = vector.broadcast %j : index to vector<8xindex>
  %mask = arith.cmpi ugt, %lanes, %splat : vector<8xindex>
  scf.parallel (%i) = (%c0) to (%c16) step (%c1) {
    %x = vector.transfer_read %a[%i, %c0], %poison {in_bounds = [true]} : memref<16x8xf32>, vector<8xf32>
    %y = arith.addf %x, %first : vector<8xf32>
    %z = arith.select %mask, %y, %zero : vector<8xi1>, vector<8xf32>
    vector.transfer_write %z, %a[%i, %c0] {in_bounds = [true]} : vector<8xf32>, memref<16x8xf32>
    scf.reduce
  }
  return
}
"""


def _outside_vectors(loop: ir.Operation) -> set[str]:
    """The names of the ops outside ``loop`` whose vectors it reads."""
    inside = set(walk(loop))
    return {value.owner.operation.name for op in inside for value in op.operands
            if isinstance(value.type, ir.VectorType) and not isinstance(value.owner, ir.Block)
            and value.owner.operation not in inside}


class ParallelConstantsIrTest(absltest.TestCase):
    def test_mask_and_constants_cloned_a_loaded_vector_not(self):
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_MASKED_ROWS)
            (loop,) = [op for op in walk(module.operation) if op.name == "scf.parallel"]
            self.assertEqual(_outside_vectors(loop), {"arith.cmpi", "arith.constant", "vector.transfer_read"})
            self.assertTrue(clone_vectors_into_parallel_loops(module, pb.Options()))
            module.operation.verify()
            self.assertEqual(_outside_vectors(loop), {"vector.transfer_read"})
            self.assertLessEqual({"vector.step", "vector.broadcast", "arith.cmpi"}, {op.name for op in walk(loop)})
            self.assertFalse(clone_vectors_into_parallel_loops(module, pb.Options()))

    def test_kernels_recompute_constant_vectors(self):
        # A kernel took a constant vector as an argument, where LLVM could fold none of it.
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(_MASKED_ROWS.replace("vector.broadcast %j", "vector.broadcast %c1"))
            outline.outline_kernels(module, pb.Options())
            module.operation.verify()
            calls = [op for op in walk(module.operation) if op.name == "func.call"]
            self.assertLen(calls, 1)
            passed = [v.owner.operation.name for v in calls[0].operands if isinstance(v.type, ir.VectorType)]
            self.assertEqual(passed, ["vector.transfer_read"])


class ParallelConstantsProgramTest(absltest.TestCase):
    def test_masked_updates_in_a_loop_match_xla(self):
        # LU's column steps: parallel updates masked by the step's row and column.
        rng = np.random.default_rng(4)
        a = rng.standard_normal((8, 24, 24)).astype(np.float32) + 4 * np.eye(24, dtype=np.float32)
        support.check_against_xla(self, jnp.linalg.inv, a, rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    absltest.main()
