"""Code generation by LLVM's tools (cpu/codegen.py): a module split into parts, each
optimized and compiled in a process of its own, linked into one library; against XLA.

The matmuls accumulate in another order than XLA: rtol/atol 1e-5, as in test_fusion.py.
"""
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import polyblocks_jax as pb
import support
from polyblocks_jax import compiler
from polyblocks_jax.cpu import codegen
from polyblocks_jax.errors import CompilationError


def _layers(x, w1, w2, w3):
    h = jax.nn.relu(x @ w1)
    h = jnp.tanh(h @ w2) + h
    return jax.nn.softmax(h @ w3, axis=-1)


def _arguments():
    rng = np.random.default_rng(0)
    shapes = [(16, 64), (64, 64), (64, 64), (64, 32)]
    return [rng.standard_normal(s).astype(np.float32) / 8 for s in shapes]


def _lowered(args):
    return jax.jit(_layers).trace(*args).lower(lowering_platforms=("cpu",))


class CodegenTest(parameterized.TestCase):
    def setUp(self):
        compiler.CACHE.clear()

    @parameterized.parameters(1, 2, 3)
    def test_parts_link_into_one_library(self, parts):
        split = codegen._split
        pieces = []

        def forced(source, _parts):
            pieces.extend(split(source, parts))
            return pieces
        args = _arguments()
        with mock.patch.object(codegen, "_split", forced):
            got = support.polyblocks(_layers, *args)
        self.assertLen(pieces, parts)
        support.assert_close(self, got, support.xla_cpu(_layers, *args), rtol=1e-5, atol=1e-5)

    def test_a_tool_that_fails_names_its_stage(self):
        with mock.patch.object(codegen, "_OPTIMIZER_OPTIONS", ("-no-such-option",)):
            with self.assertRaises(CompilationError) as raised:
                pb.compile(_lowered(_arguments()))
        self.assertEqual(raised.exception.stage, "optimize")
        self.assertIn("opt failed", str(raised.exception))

    def test_the_library_is_what_serializes(self):
        args = _arguments()
        exe = pb.compile(_lowered(args))
        self.assertTrue(exe.serialize().endswith(exe._exe.library))
        loaded = pb.deserialize(exe.serialize())
        support.assert_close(self, list(loaded(*args)), support.xla_cpu(_layers, *args), rtol=1e-5, atol=1e-5)


if __name__ == "__main__":
    absltest.main()
