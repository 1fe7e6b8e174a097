"""Buffer donation through ``polyblocks_jax.compile``: outputs computed in donated inputs' memory.

Each program runs on copies of its arguments and is compared with XLA CPU; ``aliases``
says which outputs the compiler placed in a donated input's buffer, and such an output
must be that very input array. The PJRT side (jax.Array donation) is in test_pjrt.py.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

import polyblocks_jax as pb
import support

RNG = np.random.default_rng(7)
M = RNG.standard_normal((64, 256)).astype(np.float32)
N = RNG.standard_normal((64, 256)).astype(np.float32)
S = RNG.standard_normal((48, 48)).astype(np.float32)
ROW = RNG.standard_normal((1, 256)).astype(np.float32)
EIGHTHS = np.round(N * 8) / 8  # sums exactly in any order: the comparison tests placement, not rounding


def _update(a, i, row):
    return jax.lax.dynamic_update_slice(a, row, (i, jnp.zeros_like(i)))


def _loop(a):
    return jax.lax.fori_loop(0, 5, lambda i, x: x * 0.5 + 1.0, a)


EITHER = "in place or not"  # an expected alias that depends on the host's vector width
# name: (fn, args, donate_argnums, options, expected aliases: output -> donated input or None)
PROGRAMS = {
    # elementwise: a vectorized scf.forall, then a plain linalg.generic, write in place
    "sgd_step": (lambda p, g: p - 0.1 * g, (M, N), (0,), {}, (0,)),
    "sgd_step_unvectorized": (lambda p, g: p - 0.1 * g, (M, N), (0,), {"vectorize": False}, (0,)),
    "softmax_rows": (lambda a: jax.nn.softmax(a, axis=-1), (M,), (0,), {}, (0,)),
    "softmax_columns": (lambda a: jax.nn.softmax(a, axis=0), (M,), (0,), {}, (0,)),
    "broadcast_of_reduction": (lambda a, b: a * b.sum(axis=1, keepdims=True), (M, EIGHTHS), (0,), {}, (0,)),
    # a slice update writes only the slice: the rest of the buffer is never copied
    "slice_update": (_update, (M, np.int32(5), ROW), (0,), {}, (0,)),
    # bufferization cannot resolve this tie: compiled again without it (given up, not reused)
    "loop_carrying_the_argument": (_loop, (M,), (0,), {}, (None,)),
    # the transposition is computed aside first, then the sum writes in place
    "transpose": (lambda a: a.T + 1.0, (S,), (0,), {}, (0,)),
    "transpose_unvectorized": (lambda a: a.T + 1.0, (S,), (0,), {"vectorize": False}, (0,)),
    # a tiled matmul reads rows and columns its result overwrites: computed in its own buffer,
    # then returned there or copied into the donated one (as the vector width splits columns)
    "matmul": (lambda a, b: a @ b, (S, S.T.copy()), (0,), {}, (EITHER,)),
    # read after the donated result is computed, in another order: in place would clobber it
    "read_after": (lambda a, b: (a + b, a[::-1] * 2.0), (M, N), (0,), {}, (None, None)),
    # read by a sibling over the same elements: one loop computes both (sibling_fusion.py),
    # each element read before it is overwritten
    "read_by_sibling": (lambda a, b: (a + b, a * 2.0), (M, N), (0,), {}, (0, None)),
    "scalar": (lambda s: s * 2.0, (np.float32(3.0),), (0,), {}, (0,)),
    "zero_size": (lambda a: a + 1.0, (np.zeros((0, 3), np.float32),), (0,), {}, (0,)),
    "returned_unchanged": (lambda a, b: (a, a + b), (M, N), (0,), {}, (0, None)),
    "swapped": (lambda a, b: (b, a), (M, N), (0, 1), {}, (0, 1)),
}


def _lower(fn, args, donate_argnums):
    return jax.jit(fn, donate_argnums=donate_argnums).trace(*args).lower(lowering_platforms=("cpu",))


class CompileDonationTest(parameterized.TestCase):
    @parameterized.named_parameters(*[(name, name) for name in PROGRAMS])
    def test_program(self, name):
        fn, args, donate, options, expected = PROGRAMS[name]
        want = support.xla_cpu(fn, *args)
        exe = pb.compile(_lower(fn, args, donate), pb.Options(**options))
        self.assertEqual(exe.donated, frozenset(donate))
        expected = tuple(exe.aliases[k] if i is EITHER and exe.aliases[k] in (None, *donate) else i
                         for k, i in enumerate(expected))
        self.assertEqual(exe.aliases, expected)
        mine = [np.array(a, copy=True) for a in args]
        got = exe(*mine)
        support.assert_close(self, list(got), want, msg=name)
        for k, i in enumerate(expected):
            if i is not None:
                self.assertIs(got[k], mine[i], f"output {k} is not donated argument {i}")

    def test_read_only_and_shared_arguments_are_not_overwritten(self):
        exe = pb.compile(_lower(lambda p, g: p - 0.1 * g, (M, N), (0,)))
        frozen = np.array(M, copy=True)
        frozen.setflags(write=False)
        got = exe(frozen, N)
        support.assert_close(self, list(got), [M - np.float32(0.1) * N])
        np.testing.assert_array_equal(frozen, M)
        same = np.array(M, copy=True)
        got = exe(same, same)  # donated and read through another argument: a private copy
        support.assert_close(self, list(got), [M - np.float32(0.1) * M])
        np.testing.assert_array_equal(same, M)

    def test_donate_argnums_replaces_the_program_marks(self):
        def fn(p, g):
            return p - 0.1 * g
        plain = jax.jit(fn).trace(M, N).lower(lowering_platforms=("cpu",))
        exe = pb.compile(plain, pb.Options(), donate_argnums=(1,))  # g becomes the donor: same type as the result
        self.assertEqual((exe.donated, exe.aliases), (frozenset({1}), (1,)))
        g = np.array(N, copy=True)
        got = exe(np.array(M, copy=True), g)
        self.assertIs(got[0], g)
        support.assert_close(self, list(got), support.xla_cpu(fn, M, N))
        kept = pb.compile(_lower(fn, (M, N), (0,)), donate_argnums=())
        self.assertEqual((kept.donated, kept.aliases), (frozenset(), (None,)))
        with self.assertRaisesRegex(pb.InvalidArgumentError, "donate_argnums: 2"):
            pb.compile(plain, donate_argnums=(2,))

    def test_donor_without_a_result_of_its_type_is_not_aliased(self):
        fn = lambda a: a.sum(axis=0)  # noqa: E731
        exe = pb.compile(jax.jit(fn).trace(M).lower(lowering_platforms=("cpu",)), donate_argnums=(0,))
        self.assertEqual((exe.donated, exe.aliases), (frozenset({0}), (None,)))
        support.assert_close(self, list(exe(np.array(M, copy=True))), support.xla_cpu(fn, M))

    def test_serialized_executable_keeps_donation(self):
        fn = _update
        exe = pb.compile(_lower(fn, (M, np.int32(3), ROW), (0,)))
        loaded = pb.deserialize(exe.serialize())
        self.assertEqual((loaded.donated, loaded.aliases, loaded.overwritten),
                         (exe.donated, exe.aliases, exe.overwritten))
        a = np.array(M, copy=True)
        got = loaded(a, np.int32(3), ROW)
        self.assertIs(got[0], a)
        support.assert_close(self, list(got), support.xla_cpu(fn, M, np.int32(3), ROW))


class CacheKeyTest(absltest.TestCase):
    def test_same_program_from_two_source_lines_compiles_once(self):
        x = np.arange(6, dtype=np.float32)
        first = jax.jit(lambda a: jnp.sin(a) * 3.0 + 0.25).trace(x).lower(lowering_platforms=("cpu",))
        second = jax.jit(lambda a: jnp.sin(a) * 3.0 + 0.25).trace(x).lower(lowering_platforms=("cpu",))
        self.assertNotEqual(first.as_text(debug_info=True), second.as_text(debug_info=True))
        self.assertIs(pb.compile(first), pb.compile(second))
        donating = pb.compile(first, donate_argnums=(0,))
        self.assertIsNot(donating, pb.compile(first))
        self.assertEqual(donating.aliases, (0,))


if __name__ == "__main__":
    absltest.main()
