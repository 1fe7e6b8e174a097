"""Replays every program the fuzzer found failing (tests/fuzz/regressions/*.json).

A file with ``"status": "fixed"`` must now match XLA under every setting; one still
``"open"`` must still fail, so that its fix is noticed (flip it to "fixed" then).
Every program is replayed in a child process: some killed the fuzzer's worker, and an
open case may abort under a setting other than the one that found it.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

from absl.testing import absltest, parameterized

DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "regressions")
CASES = sorted(glob.glob(os.path.join(DIRECTORY, "*.json")))


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


class RegressionTest(parameterized.TestCase):
    def test_there_are_regressions(self):
        self.assertNotEmpty(CASES)

    @parameterized.named_parameters((os.path.basename(p)[:-5], p) for p in CASES)
    def test_replay(self, path):
        case = load(path)
        self.assertIn(case["status"], ("open", "fixed"), path)
        passed = replay_in_child(path)
        self.assertEqual(passed, case["status"] == "fixed",
                         f"{path} passes now: mark it fixed" if passed else f"{path} fails again")


def replay_in_child(path: str) -> bool:
    code = ("import json, sys; sys.path.insert(0, %r); from fuzz import differential; "
            "print('replaying', flush=True); "
            "differential.check(json.load(open(%r))['spec'], differential.ALL_SETTINGS)"
            % (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if "replaying" not in done.stdout:  # the child never reached the program: a broken harness
        raise AssertionError(f"replay of {path} did not start:\n{done.stderr[-2000:]}")
    return done.returncode == 0


if __name__ == "__main__":
    absltest.main()
