"""Repeated layers share one function through the tensor stages (passes/shared_layers.py)."""
from __future__ import annotations

import collections
import functools

import jax
import numpy as np
from absl.testing import absltest
from mlir import ir

import polyblocks_jax as pb
import support
from polyblocks_jax.passes import shared_layers
from polyblocks_jax.passes.tiling import Hardware
from polyblocks_jax.passes.transform import walk

HOST = Hardware(vector_bits=512, vector_registers=32, l1_bytes=32 << 10, l2_bytes=1 << 20)
TOLERANCE = dict(rtol=1e-5, atol=1e-5)
LAYERS = 4


def _block(x, w, b, g):
    """A residual MLP block with a layernorm: a few dozen ops, as a transformer's."""
    y = x + jax.nn.gelu(x @ w + b, approximate=False)
    mean = y.mean(-1, keepdims=True)
    var = ((y - mean) ** 2).mean(-1, keepdims=True)
    return (y - mean) * jax.lax.rsqrt(var + 1e-5) * g


def _stack(x, weights):
    for w, b, g in weights:
        x = _block(x, w, b, g)
    return x


def _scaled_stack(x, weights):
    """The same blocks, each scaled by a constant of its own: no two are equal."""
    for i, (w, b, g) in enumerate(weights):
        x = _block(x, w, b, g) * (i + 2.0)
    return x


def _first_wired_apart(x, weights):
    """The first block reads one argument for both its bias and its scale: wired unlike the
    rest (its own scale is read after the last, so that no argument goes unused)."""
    (w, b, g), *rest = weights
    return _stack(_block(x, w, b, b), rest) * g


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((16, 64), np.float32)
    weights = [(rng.standard_normal((64, 64), np.float32) / 8, rng.standard_normal(64, np.float32),
                rng.standard_normal(64, np.float32)) for _ in range(LAYERS)]
    return x, weights


_after = functools.partial(support.module_after, hardware=HOST)


def _layer_calls(module: ir.Module) -> list[str]:
    return [ir.FlatSymbolRefAttr(op.attributes["callee"]).value for op in walk(module.operation)
            if op.name == "func.call"]


def _functions(module: ir.Module) -> list[str]:
    return [op.attributes["sym_name"].value for op in module.body.operations]


class SharedLayersTest(absltest.TestCase):

    def test_equal_layers_call_one_function(self):
        module = _after("shared-layers", _stack, *_inputs())
        self.assertEqual(_functions(module), ["main", f"{shared_layers.PREFIX}0"])
        self.assertEqual(_layer_calls(module), [f"{shared_layers.PREFIX}0"] * LAYERS)
        self.assertTrue(module.operation.verify())

    def test_the_layer_is_bufferized_once(self):
        # through bufferization and the deallocation pipeline as one function on buffers,
        # its result an out-parameter of each call
        module = _after("out-params", _stack, *_inputs())
        self.assertEqual(_functions(module), ["main", f"{shared_layers.PREFIX}0"])
        self.assertEqual(_layer_calls(module), [f"{shared_layers.PREFIX}0"] * LAYERS)
        layer = module.body.operations[1]
        self.assertNotIn("tensor<", str(ir.TypeAttr(layer.attributes["function_type"]).value))
        self.assertEqual(len(ir.TypeAttr(layer.attributes["function_type"]).value.results), 0)

    def test_each_call_gets_its_body_back(self):
        # the layer's loop nests outlined once (cpu/outline.py): each copy calls its kernels
        module = _after("shared-layers-inline", _stack, *_inputs())
        kernels = _functions(module)[1:]
        self.assertEqual(_functions(module)[0], "main")
        self.assertTrue(kernels)
        self.assertFalse([name for name in kernels if name.startswith(shared_layers.PREFIX)])
        calls = collections.Counter(_layer_calls(module))
        self.assertEqual(set(calls), set(kernels))
        self.assertTrue(all(count % LAYERS == 0 for count in calls.values()), calls)
        self.assertTrue(module.operation.verify())

    def test_layers_with_constants_of_their_own_stay_apart(self):
        module = _after("shared-layers", _scaled_stack, *_inputs())
        self.assertEqual(_functions(module), ["main"])

    def test_a_layer_wired_otherwise_stays_out(self):
        module = _after("shared-layers", _first_wired_apart, *_inputs())
        self.assertEqual(_layer_calls(module), [f"{shared_layers.PREFIX}0"] * (LAYERS - 1))

    def test_results_match_xla_shared_or_not(self):
        for fn in (_stack, _scaled_stack, _first_wired_apart):
            for options in (pb.Options(), pb.Options(share_layers=False), pb.Options(fusion=False)):
                with self.subTest(fn=fn.__name__, options=options):
                    support.check_against_xla(self, fn, *_inputs(1), options=options, **TOLERANCE)

    def test_shared_and_unshared_results_are_bit_equal(self):
        shared, unshared = (support.polyblocks(_stack, *_inputs(2), options=options)
                            for options in (pb.Options(), pb.Options(share_layers=False)))
        np.testing.assert_array_equal(shared[0], unshared[0])


if __name__ == "__main__":
    jax.config.update("jax_platforms", "cpu")
    absltest.main()
