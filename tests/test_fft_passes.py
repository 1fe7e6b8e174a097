"""The stages that let an FFT pass's r outputs land in one buffer, on IR (no execution).

A Stockham pass (stablehlo_import/fft_passes.py) is one generic of 2r results, each
inserted into a concatenation: the in-place stage makes the tiled loop write the
concatenation itself, and the forwarded-copies stage writes the tiles that bufferization
still gave temporaries into their slices. End-to-end checks are in test_fft.py.
"""
from absl.testing import absltest, parameterized
from mlir import ir

import polyblocks_jax as pb
from polyblocks_jax.passes.forwarded_copies import forward_copies
from polyblocks_jax.passes.in_place import compute_in_place
from polyblocks_jax.passes.transform import walk

CONCATENATED_LOOP = """
func.func @main(%x: tensor<2x64xf32>) -> RESULT {
  %e = tensor.empty() : tensor<2x64xf32>
  %r:2 = scf.forall (%i) in (8) shared_outs(%a = %e, %b = %e) -> (tensor<2x64xf32>, tensor<2x64xf32>) {
    %off = affine.apply affine_map<(d0) -> (d0 * 8)>(%i)
    %in = tensor.extract_slice %x[0, %off] [2, 8] [1, 1] : tensor<2x64xf32> to tensor<2x8xf32>
    %ta = tensor.extract_slice %a[0, %off] [2, 8] [1, 1] : tensor<2x64xf32> to tensor<2x8xf32>
    %tb = tensor.extract_slice %b[0, %off] [2, 8] [1, 1] : tensor<2x64xf32> to tensor<2x8xf32>
    %wa = linalg.add ins(%in, %in : tensor<2x8xf32>, tensor<2x8xf32>) outs(%ta : tensor<2x8xf32>) -> tensor<2x8xf32>
    %wb = linalg.sub ins(%in, %in : tensor<2x8xf32>, tensor<2x8xf32>) outs(%tb : tensor<2x8xf32>) -> tensor<2x8xf32>
    scf.forall.in_parallel {
      tensor.parallel_insert_slice %wa into %a[0, %off] [2, 8] [1, 1] : tensor<2x8xf32> into tensor<2x64xf32>
      tensor.parallel_insert_slice %wb into %b[0, %off] [2, 8] [1, 1] : tensor<2x8xf32> into tensor<2x64xf32>
    }
  }
  CONCATENATION
}"""
# Along a new dim (the tile offsets keep theirs), and along the tiles' dim (the second
# result's tile read and write at offsets moved by 64).
STACKED = """%c = tensor.empty() : tensor<2x2x64xf32>
  %c0 = tensor.insert_slice %r#0 into %c[0, 0, 0] [2, 1, 64] [1, 1, 1] : tensor<2x64xf32> into tensor<2x2x64xf32>
  %c1 = tensor.insert_slice %r#1 into %c0[0, 1, 0] [2, 1, 64] [1, 1, 1] : tensor<2x64xf32> into tensor<2x2x64xf32>
  return %c1 : tensor<2x2x64xf32>"""
SIDE_BY_SIDE = """%c = tensor.empty() : tensor<2x128xf32>
  %c0 = tensor.insert_slice %r#0 into %c[0, 0] [2, 64] [1, 1] : tensor<2x64xf32> into tensor<2x128xf32>
  %c1 = tensor.insert_slice %r#1 into %c0[0, 64] [2, 64] [1, 1] : tensor<2x64xf32> into tensor<2x128xf32>
  return %c1 : tensor<2x128xf32>"""

COPIED_TEMPORARY = """
func.func @main(%x: memref<64xf32>) -> memref<4x64xf32> {
  %out = memref.alloc() : memref<4x64xf32>
  %c0 = arith.constant 0 : index
  %cst = arith.constant 0.0 : f32
  %v = vector.transfer_read %x[%c0], %cst {in_bounds = [true]} : memref<64xf32>, vector<64xf32>
  %t = memref.alloc() : memref<64xf32>
  vector.transfer_write %v, %t[%c0] {in_bounds = [true]} : vector<64xf32>, memref<64xf32>
  %other = memref.subview %out[2, 0] [1, 64] [1, 1] : memref<4x64xf32> to memref<64xf32, strided<[1], offset: 128>>
  BETWEEN
  %s = memref.subview %out[1, 0] [1, 64] [1, 1] : memref<4x64xf32> to memref<64xf32, strided<[1], offset: 64>>
  memref.copy %t, %s : memref<64xf32> to memref<64xf32, strided<[1], offset: 64>>
  return %out : memref<4x64xf32>
}"""
_WRITE_APART = ("vector.transfer_write %v, %other[%c0] {in_bounds = [true]} : vector<64xf32>, "
                "memref<64xf32, strided<[1], offset: 128>>")
_READ_OF_OUT = ("%w = vector.transfer_read %out[%c0, %c0], %cst {in_bounds = [true]} "
                ": memref<4x64xf32>, vector<64xf32>\n"
                "  vector.transfer_write %w, %x[%c0] {in_bounds = [true]} : vector<64xf32>, memref<64xf32>")


def _names(module: ir.Module) -> list[str]:
    return [op.name for op in walk(module.operation)]


class ConcatenatedLoopTest(parameterized.TestCase):
    @parameterized.parameters((STACKED, "tensor<2x2x64xf32>", 0), (SIDE_BY_SIDE, "tensor<2x128xf32>", 2))
    def test_results_of_a_loop_concatenated_become_one_result(self, concatenation, result, additions):
        text = CONCATENATED_LOOP.replace("CONCATENATION", concatenation).replace("RESULT", result)
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(text)
            compute_in_place(module, pb.Options())
            module.operation.verify()
            names = _names(module)
            self.assertNotIn("tensor.insert_slice", names)
            (loop,) = [op for op in walk(module.operation) if op.name == "scf.forall"]
            self.assertEqual([str(r.type) for r in loop.results], [result])
            self.assertEqual(names.count("tensor.parallel_insert_slice"), 2)
            self.assertEqual(names.count("arith.addi"), additions)


class ForwardedCopiesTest(absltest.TestCase):
    def _forwarded(self, between: str) -> bool:
        with ir.Context(), ir.Location.unknown():
            module = ir.Module.parse(COPIED_TEMPORARY.replace("BETWEEN", between))
            changed = forward_copies(module, pb.Options())
            module.operation.verify()
            names = _names(module)
        self.assertEqual(changed, "memref.copy" not in names)
        self.assertEqual(names.count("memref.alloc"), 1 if changed else 2)
        return changed

    def test_temporary_written_in_its_destination(self):
        self.assertTrue(self._forwarded(""))

    def test_write_to_a_slice_apart_keeps_it_forwarded(self):
        self.assertTrue(self._forwarded(_WRITE_APART))

    def test_read_of_the_destination_between_keeps_the_copy(self):
        self.assertFalse(self._forwarded(_READ_OF_OUT))


if __name__ == "__main__":
    absltest.main()
