"""The next tile's prefetch in a tile's last pass (cpu/prefetch.py): where it goes, what it
reads, and results equal to XLA's with it and without it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized
from mlir import ir

import polyblocks_jax as pb
from polyblocks_jax import cpu
from polyblocks_jax.passes.transform import walk
from tests import support


def layernorm_gelu(x, scale, bias):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return jax.nn.gelu((x - mean) * jax.lax.rsqrt(var + 1e-6) * scale + bias, approximate=False)


def _arguments(rows: int, dim: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, rows, dim), np.float32), rng.standard_normal(dim, np.float32),
            rng.standard_normal(dim, np.float32)]


def _prefetches(fn, *args) -> tuple[ir.Module, list[ir.Operation]]:
    """The module after the prefetch stage (the ops live while it does), and its prefetches."""
    module = support.module_after("prefetch", fn, *args, hardware=cpu.host().hardware())
    return module, [op for op in walk(module.operation) if op.name == "memref.prefetch"]


def _enclosing_loop(op: ir.Operation) -> ir.Operation:
    while op.name != "scf.for":
        op = op.parent.operation
    return op


class PrefetchPlacementTest(absltest.TestCase):
    def test_layernorm_prefetches_its_input_in_the_last_pass_only(self):
        x, scale, bias = _arguments(64, 256)
        module, prefetches = _prefetches(layernorm_gelu, x, scale, bias)
        self.assertNotEmpty(prefetches)
        self.assertTrue(module.operation.verify())
        for prefetch in prefetches:
            # the input (the function's first argument), not the scale or the bias
            self.assertIsInstance(prefetch.operands[0], ir.BlockArgument)
            self.assertEqual(ir.BlockArgument(prefetch.operands[0]).arg_number, 0)
            # in the pass that writes the result, none in the mean's or the variance's
            names = {op.name for op in walk(_enclosing_loop(prefetch))}
            self.assertIn("vector.transfer_write", names)
            self.assertNotIn("vector.reduction", names)
        # one per cache line read: 64-byte lines of f32 in the last pass's vectors
        loop = _enclosing_loop(prefetches[0])
        lanes = max(ir.VectorType(op.results[0].type).shape[0] for op in walk(loop)
                    if op.name == "vector.transfer_read")
        self.assertLen([p for p in prefetches if _enclosing_loop(p) == loop], lanes // 16)

    def test_one_pass_kernel_gets_none(self):
        x = np.random.default_rng(1).standard_normal((2, 64, 256), np.float32)
        self.assertEmpty(_prefetches(lambda v: jax.nn.gelu(v, approximate=False), x)[1])

    def test_switched_off_there_is_no_stage(self):
        names = [s.name for s in cpu.cpu_stages(pb.Options(prefetch=False))]
        self.assertNotIn("prefetch", names)
        self.assertIn("prefetch", [s.name for s in cpu.cpu_stages(pb.Options())])


class PrefetchResultsTest(parameterized.TestCase):
    @parameterized.parameters(((64, 256), True), ((64, 256), False), ((37, 768), True), ((5, 96), True))
    def test_layernorm_gelu_against_xla(self, shape, prefetch):
        # 37 and 5 rows: tiles that do not divide the rows, the last one's successor clamped
        if prefetch:
            self.assertNotEmpty(_prefetches(layernorm_gelu, *_arguments(*shape))[1])
        support.check_against_xla(self, layernorm_gelu, *_arguments(*shape),
                                  options=pb.Options(prefetch=prefetch))

    def test_softmax_against_xla(self):
        x = np.random.default_rng(2).standard_normal((8, 96, 1000), np.float32)
        self.assertNotEmpty(_prefetches(lambda v: jax.nn.softmax(v, axis=-1), x)[1])
        support.check_against_xla(self, lambda v: jax.nn.softmax(v, axis=-1), x)

    def test_layernorm_with_special_values_against_xla(self):
        rng = np.random.default_rng(3)
        x = support.random_array(rng, (2, 64, 256), np.float32)
        def standardize(v):
            return (v - jnp.mean(v, -1, keepdims=True)) / jnp.std(v, -1, keepdims=True)
        self.assertNotEmpty(_prefetches(standardize, x)[1])
        support.check_against_xla(self, standardize, x)


if __name__ == "__main__":
    absltest.main()
