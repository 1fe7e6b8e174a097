"""Python callbacks from compiled code: jax.debug.print, pure_callback and io_callback on
platform "polyblocks", inside jit, vmap, scan, while loops and grad, against XLA CPU."""
from __future__ import annotations

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest
from jax import lax
from jax.experimental import io_callback

import polyblocks_jax as pb
import support  # enables x64
from polyblocks_jax.errors import CallbackError, UnsupportedError


def _run(fn, device: str, *args):
    """``jax.jit(fn)`` with its arguments on ``device``'s platform: (results as numpy, stdout)."""
    target = jax.devices(device)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        results = jax.jit(fn)(*[jax.device_put(a, target) for a in args])
        results = [np.asarray(r) for r in jax.tree_util.tree_leaves(results)]
        jax.effects_barrier()
    return results, out.getvalue()


def _both(fn, *args):
    """(polyblocks, XLA CPU) runs of ``fn``."""
    return _run(fn, "polyblocks", *args), _run(fn, "cpu", *args)


def _sin(x):
    return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x, vmap_method="sequential")


class DebugPrintTest(absltest.TestCase):

    def test_prints_in_program_order_as_xla(self):
        def fn(x):
            jax.debug.print("start {x}", x=x, ordered=True)

            def step(c, v):
                jax.debug.print("step {c} {v}", c=c, v=v, ordered=True)
                return c + v, c * v

            total, products = lax.scan(step, x[0], x)

            def cond(c):
                jax.debug.print("cond {c}", c=c, ordered=True)
                return c < 20.0

            def body(c):
                jax.debug.print("body {c}", c=c, ordered=True)
                return c * 2.0

            grown = lax.while_loop(cond, body, total)
            picked = lax.cond(grown > 21.0, lambda v: (jax.debug.print("big {v}", v=v, ordered=True), v)[1],
                              lambda v: v, grown)
            return picked, products

        (pb_out, pb_text), (xla_out, xla_text) = _both(fn, np.arange(1.0, 5.0, dtype=np.float32))
        support.assert_close(self, pb_out, xla_out)
        self.assertEqual(pb_text, xla_text)
        self.assertTrue(pb_text.endswith("cond 22.0\nbig 22.0\n"), pb_text)

    def test_loop_invariant_prints_run_every_iteration(self):
        def fn(x, y):
            def body(i, c):
                jax.debug.print("tick", ordered=True)
                jax.debug.print("y {y}", y=y, ordered=True)
                return c + y
            return lax.fori_loop(0, 3, body, x)

        (pb_out, pb_text), (xla_out, xla_text) = _both(fn, np.float32(0.0), np.float32(5.0))
        support.assert_close(self, pb_out, xla_out)
        self.assertEqual(pb_text, xla_text)
        self.assertEqual(pb_text, "tick\ny 5.0\n" * 3)

    def test_prints_under_vmap_and_grad_as_xla(self):
        def loss(x):
            jax.debug.print("x {x}", x=x)
            return jnp.sum(jnp.sin(x) ** 2)

        def fn(xs):
            return jax.vmap(jax.grad(loss))(xs)

        (pb_out, pb_text), (xla_out, xla_text) = _both(fn, np.arange(6.0).reshape(3, 2))
        support.assert_close(self, pb_out, xla_out)
        self.assertEqual(sorted(pb_text.splitlines()), sorted(xla_text.splitlines()))
        self.assertLen(pb_text.splitlines(), 3)


class PureCallbackTest(absltest.TestCase):

    def test_jit_vmap_scan_while_as_xla(self):
        def fn(x):
            a = _sin(x)
            b = jax.vmap(_sin)(x.reshape(2, 3))  # a loop of calls
            c = jax.vmap(lambda v: jax.pure_callback(
                np.cos, jax.ShapeDtypeStruct(v.shape, v.dtype), v, vmap_method="expand_dims"))(x)
            d, _ = lax.scan(lambda s, v: (s + _sin(v), None), jnp.zeros((), x.dtype), x)
            e = lax.while_loop(lambda s: _sin(s)[0] < 0.99, lambda s: s + 0.1, x[:2])
            return a, b, c, d, e

        (pb_out, _), (xla_out, _) = _both(fn, np.linspace(-1.0, 1.0, 6))
        support.assert_close(self, pb_out, xla_out)

    def test_gradient_through_custom_jvp_as_xla(self):
        @jax.custom_jvp
        def sin(x):
            return _sin(x)

        @sin.defjvp
        def sin_jvp(primals, tangents):
            (x,), (t,) = primals, tangents
            return sin(x), jax.pure_callback(np.cos, jax.ShapeDtypeStruct(x.shape, x.dtype), x) * t

        def fn(x):
            return jax.grad(lambda v: jnp.sum(sin(v) * v))(x)

        (pb_out, _), (xla_out, _) = _both(fn, np.linspace(0.0, 2.0, 5))
        support.assert_close(self, pb_out, xla_out)

    def test_strided_result_as_xla(self):
        """A result the callback returns transposed is copied whole, from memory that stays alive
        (large enough that freed memory goes back to the system)."""
        def fn(x):
            return jax.pure_callback(lambda v: np.asarray(v).T * 2, jax.ShapeDtypeStruct(x.shape[::-1], x.dtype), x)

        x = support.random_array(np.random.default_rng(0), (512, 384), np.float32, edge=False)
        (pb_out, _), (xla_out, _) = _both(fn, x)
        support.assert_close(self, pb_out, xla_out)

    def test_wrong_result_shape_raises(self):
        def fn(x):
            return jax.pure_callback(lambda v: np.zeros(2), jax.ShapeDtypeStruct((3,), x.dtype), x)

        with self.assertRaisesRegex(RuntimeError, "Incorrect output shape"):
            _run(fn, "polyblocks", np.ones(3))


class IoCallbackTest(absltest.TestCase):

    def _logged(self, device: str, ordered: bool):
        log = []

        def record(v):
            log.append(float(v))
            return np.asarray(v * 10.0, dtype=v.dtype)

        def fn(x):
            def step(c, v):
                out = io_callback(record, jax.ShapeDtypeStruct((), v.dtype), c + v, ordered=ordered)
                return c + out, out
            return lax.scan(step, jnp.zeros((), x.dtype), x)

        first = _run(fn, device, np.arange(4.0))[0]
        second = _run(fn, device, np.arange(4.0))[0]  # the token comes back and goes in again
        return first + second, log

    def test_ordered_calls_and_results_as_xla(self):
        pb_out, pb_log = self._logged("polyblocks", ordered=True)
        xla_out, xla_log = self._logged("cpu", ordered=True)
        support.assert_close(self, pb_out, xla_out)
        self.assertEqual(pb_log, xla_log)
        self.assertLen(pb_log, 8)

    def test_unordered_calls_and_results_as_xla(self):
        pb_out, pb_log = self._logged("polyblocks", ordered=False)
        xla_out, xla_log = self._logged("cpu", ordered=False)
        support.assert_close(self, pb_out, xla_out)
        self.assertEqual(sorted(pb_log), sorted(xla_log))


class ExceptionTest(absltest.TestCase):

    def test_exception_reaches_the_caller_and_the_process_goes_on(self):
        def boom(v):
            raise ValueError("boom from the callback")

        def fn(x):
            return jax.pure_callback(boom, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1.0

        with self.assertRaisesRegex(RuntimeError, "boom from the callback"):
            _run(fn, "polyblocks", np.ones(3))
        (out,), _ = _run(lambda x: _sin(x) + 1.0, "polyblocks", np.ones(3))
        np.testing.assert_allclose(out, np.sin(1.0) + 1.0)

    def test_a_loop_driven_by_a_failing_callback_stops(self):
        calls = []

        def step(v):  # raises on its third call; the loop only ends on what it returns
            calls.append(v)
            if len(calls) == 3:
                raise KeyError("third step")
            return np.asarray(1.0, v.dtype)

        def fn(x):
            return lax.while_loop(lambda c: c < 5.0,
                                  lambda c: c + jax.pure_callback(step, jax.ShapeDtypeStruct((), c.dtype), c), x)

        with self.assertRaisesRegex(RuntimeError, "third step"):
            _run(fn, "polyblocks", np.float64(0.0))
        self.assertLen(calls, 3)

    def test_direct_compile_raises_our_error_and_keeps_the_code_in_process(self):
        def halve(v):
            if not v.all():
                raise ZeroDivisionError("a zero")
            return v / 2

        def fn(x):
            return jax.pure_callback(halve, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

        lowered = jax.jit(fn).trace(np.ones(2)).lower(lowering_platforms=("polyblocks",))
        exe = pb.compile(lowered)
        np.testing.assert_array_equal(exe(np.ones(2))[0], np.full(2, 0.5))
        with self.assertRaisesRegex(CallbackError, "ZeroDivisionError: a zero") as raised:
            exe(np.zeros(2))
        self.assertIsInstance(raised.exception.__cause__, ZeroDivisionError)
        with self.assertRaises(UnsupportedError):
            exe.serialize()

if __name__ == "__main__":
    absltest.main()
