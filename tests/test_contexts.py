"""The upstream MLIR context compiles build their IR in (polyblocks_jax/contexts.py): kept
by a thread for its next compiles, with its pass managers and the jaxlib context programs
are read in, and replaced after a bounded number; programs compiled one after another in it compute what XLA computes."""
import threading
from unittest import mock

import jax.numpy as jnp
import numpy as np
from absl.testing import absltest

import polyblocks_jax as pb
import support
from polyblocks_jax import contexts


class CompileContextTest(absltest.TestCase):
    def test_a_thread_keeps_its_context_and_pass_managers_then_starts_a_fresh_one(self):
        with mock.patch.object(contexts, "MAX_COMPILES", 2), mock.patch.object(contexts, "_slot", contexts._Slot()), \
                mock.patch.object(contexts, "_keep", True):
            with contexts.compile_context() as first:
                pm = contexts.pass_manager("builtin.module(canonicalize)", first)
            with contexts.compile_context() as second:
                self.assertIs(second, first)
                self.assertIs(contexts.pass_manager("builtin.module(canonicalize)", second), pm)
            with contexts.compile_context() as third:  # the third compile: a fresh context
                self.assertIsNot(third, first)
                self.assertIsNot(contexts.pass_manager("builtin.module(canonicalize)", third), pm)

    def test_a_thread_keeps_its_program_context_as_long_as_its_compile_context(self):
        with mock.patch.object(contexts, "MAX_COMPILES", 2), mock.patch.object(contexts, "_slot", contexts._Slot()), \
                mock.patch.object(contexts, "_keep", True):
            with contexts.compile_context():
                first = contexts.program_context()
            with contexts.compile_context():
                self.assertIs(contexts.program_context(), first)
            with contexts.compile_context():
                self.assertIsNot(contexts.program_context(), first)
        with mock.patch.object(contexts, "_keep", False):
            self.assertIsNot(contexts.program_context(), contexts.program_context())

    def test_outside_a_worker_each_compile_has_a_fresh_context(self):
        with mock.patch.object(contexts, "_keep", False):
            with contexts.compile_context() as first:
                pass
            with contexts.compile_context() as second:
                self.assertIsNot(second, first)

    @mock.patch.object(contexts, "_keep", True)
    def test_threads_do_not_share_a_context(self):
        seen = []

        def compile_once():
            with contexts.compile_context() as context:
                seen.append(context)

        threads = [threading.Thread(target=compile_once) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertIsNot(seen[0], seen[1])

    def test_programs_compiled_one_after_another_in_one_context_match_xla(self):
        rng = np.random.default_rng(0)
        x = rng.standard_normal((33, 70)).astype(np.float32)
        here = pb.Options(in_process=True)  # in this process, where the test can see the context
        with mock.patch.object(contexts, "_slot", contexts._Slot()), mock.patch.object(contexts, "_keep", True):
            for fn in (jnp.tanh, lambda a: a @ a.T, lambda a: jnp.sort(a, axis=0), lambda a: jnp.cumsum(a, 1),
                       lambda a: jnp.tanh(a) @ a.T):
                # the matmuls sum 70 products of magnitude ~1 in another order than XLA's
                support.check_against_xla(self, fn, x, rtol=1e-5, atol=1e-4, options=here)
            self.assertEqual(contexts._slot.compiles, 5)


if __name__ == "__main__":
    absltest.main()
