"""End to end through polyblocks_jax.compile on the smallest programs."""
import numpy as np
from absl.testing import absltest

import support


class SmokeTest(absltest.TestCase):
    def test_add(self):
        rng = np.random.default_rng(0)
        x, y = support.random_array(rng, (3, 4), np.float32), support.random_array(rng, (3, 4), np.float32)
        support.check_against_xla(self, lambda a, b: a + b, x, y)

    def test_repeated_and_argument_results(self):
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        support.check_against_xla(self, lambda a: (a + 1, a + 1, a, a), x)


if __name__ == "__main__":
    absltest.main()
