"""The fixed-seed CI slice of the differential fuzzer: random programs, XLA CPU vs polyblocks.

Each program runs on XLA CPU and through polyblocks under every setting of
differential.SETTINGS, compared with tests/support.py's per-dtype tolerances. The
slice is derandomized (the same programs on every run) and bounded to stay within a
few minutes on 2 cores; ``python -m tests.fuzz.long_run`` explores further.
"""
from __future__ import annotations

import json
import os
import tempfile
from unittest import mock

from absl.testing import absltest
from hypothesis import HealthCheck, given, settings

from . import differential, edge_ops, long_run, loop_programs, programs

# The slice's size: ~0.6 s per program (4 compiles) alone on 2 cores, ~75 s; a few of
# them are loop programs, larger (a body, maybe under vmap, jvp or grad).
PROGRAMS = 40
LOOP_PROGRAMS = 12
COMPLEX_PROGRAMS = 20  # programs starting from (and casting to) complex types as well
LARGE_PROGRAMS = 6  # of large and odd shapes (programs.LARGE): the cost models' tiled paths
TRANSFORMED_PROGRAMS = 8  # under vmap, jvp or grad as a whole
_CI = settings(derandomize=True, deadline=None, max_examples=PROGRAMS, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class FuzzTest(absltest.TestCase):
    ran = 0

    @_CI
    @given(programs.programs())
    def test_random_programs_match_xla(self, spec):
        FuzzTest.ran += 1
        differential.check(spec)

    @settings(_CI, max_examples=LOOP_PROGRAMS)
    @given(loop_programs.loop_programs())
    def test_random_loops_match_xla(self, spec):
        FuzzTest.ran += 1
        differential.check(spec)

    @settings(_CI, max_examples=COMPLEX_PROGRAMS)
    @given(programs.programs(dtypes=programs.COMPLEX + ("float32", "int32")))
    def test_random_complex_programs_match_xla(self, spec):
        FuzzTest.ran += 1
        differential.check(spec)

    @settings(_CI, max_examples=LARGE_PROGRAMS)
    @given(programs.programs(max_ops=4, shapes=programs.LARGE))
    def test_random_large_programs_match_xla(self, spec):
        FuzzTest.ran += 1
        differential.check(spec)

    @settings(_CI, max_examples=TRANSFORMED_PROGRAMS)
    @given(programs.programs(transforms=True, dtypes=edge_ops.TRANSFORMED_DTYPES))
    def test_random_transformed_programs_match_xla(self, spec):
        FuzzTest.ran += 1
        differential.check(spec)

    @classmethod
    def tearDownClass(cls):
        print(f"\nfuzz CI slice: {cls.ran} programs x {len(differential.SETTINGS)} settings")
        super().tearDownClass()


class LongRunTest(absltest.TestCase):
    def test_a_dead_worker_is_ours_unless_xla_alone_dies_too(self):
        with open(os.path.join(os.path.dirname(__file__), "regressions", "in-place-loop-input-returned.json")) as f:
            spec = json.load(f)["spec"]
        with tempfile.TemporaryDirectory() as out:
            with open(os.path.join(out, long_run.INFLIGHT), "w") as f:
                json.dump(spec, f)
            self.assertFalse(long_run._xla_dies(out))  # XLA computes it: the crash was ours
            with mock.patch.object(long_run, "_XLA_ONLY", "import os; os.abort()"):
                self.assertTrue(long_run._xla_dies(out))


if __name__ == "__main__":
    absltest.main()
