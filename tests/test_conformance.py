"""bench/conformance.py's own logic on fake test files: outcomes, crashes, hangs, causes, the table."""
import os
import tempfile
import textwrap
from pathlib import Path

from absl.testing import absltest

from bench import conformance
from bench.conformance import Outcome

FAKE_TESTS = """
import os, time, unittest

def test_pass(): pass
def test_abort(): os.abort()
def test_fail(): assert 1 == 2, "one is not two"
@unittest.skip("not here")
def test_skip(): pass
def test_after_abort(): pass
"""


class RunSideTest(absltest.TestCase):
    def setUp(self):
        super().setUp()
        self.dir = Path(self.enterContext(tempfile.TemporaryDirectory()))

    def run_fake(self, source: str, stall_s: float = 60) -> conformance.SideRun:
        test_file = self.dir / "fake_test.py"
        test_file.write_text(textwrap.dedent(source))
        return conformance.run_side(test_file, "cpu", [], dict(os.environ), self.dir, stall_s)

    def test_a_crash_is_recorded_and_the_file_continues(self):
        run = self.run_fake(FAKE_TESTS)
        outcomes = {test.split("::")[1]: o.outcome for test, o in run.outcomes.items()}
        self.assertEqual(outcomes, {"test_pass": "passed", "test_abort": "crashed", "test_fail": "failed",
                                    "test_skip": "skipped", "test_after_abort": "passed"})
        self.assertEqual(run.processes, 2)
        self.assertRegex(run.outcomes["fake_test.py::test_abort"].message, r"SIGABRT.* in .*fake_test.py:\d+ test_abort")
        self.assertIn("one is not two", run.outcomes["fake_test.py::test_fail"].message)
        self.assertEqual(run.errors, [])

    def test_a_hung_test_is_killed(self):
        run = self.run_fake("import time\ndef test_hang(): time.sleep(600)\ndef test_next(): pass\n", stall_s=3)
        self.assertEqual(run.outcomes["fake_test.py::test_hang"].outcome, "crashed")
        self.assertIn("hung", run.outcomes["fake_test.py::test_hang"].message)
        self.assertEqual(run.outcomes["fake_test.py::test_next"].outcome, "passed")

    def test_a_collection_error_is_reported(self):
        run = self.run_fake("import no_such_module_anywhere\ndef test_x(): pass\n")
        self.assertEqual(run.outcomes, {})
        self.assertEqual(len(run.errors), 1, run.errors)
        self.assertIn("collection of fake_test.py failed", run.errors[0])


class CompareTest(absltest.TestCase):
    def test_counts_and_causes(self):
        unsupported = "UnsupportedError: unsupported stablehlo.fft: dtype f32 in tensor<{}xf32> (at {})"
        xla = {t: Outcome("passed") for t in "abcdefg"} | {"h": Outcome("failed", "x"), "i": Outcome("skipped")}
        polyblocks = {
            "a": Outcome("passed"), "b": Outcome("failed", unsupported.format("2x3", "jit(f)/fft a.py:1")),
            "c": Outcome("failed", unsupported.format("7", "main")),
            "d": Outcome("crashed", "crashed (signal SIGSEGV)"),
            "e": Outcome("skipped", "Skipped unless running on devices with tags: cpu"),
            "f": Outcome("failed", "AssertionError:\nNot equal to tolerance rtol=1e-06\nMismatch..."),
            "h": Outcome("passed"), "i": Outcome("skipped"),
        }  # "g" is missing: its run ended early
        row = conformance.compare(xla, polyblocks)
        self.assertEqual((row["tests"], row["xla_passed"], row["polyblocks_passed"]), (9, 7, 2))
        self.assertEqual((row["failed"], row["crashed"], row["skipped"]), (4, 1, 2))
        self.assertEqual((row["eligible"], row["eligible_passed"]), (6, 1))
        self.assertEqual(row["skipped_on_polyblocks_only"],
                         [{"cause": "Skipped unless running on devices with tags: cpu", "count": 1, "tests": ["e"]}])
        causes = {c["cause"]: c["tests"] for c in row["causes"]}
        self.assertEqual(causes["UnsupportedError: unsupported stablehlo.fft: dtype f32 in tensor<…f32>"],
                         ["b", "c"])
        self.assertIn("AssertionError: Not equal to tolerance rtol=1e-06", causes)
        self.assertIn("crashed (signal SIGSEGV)", causes)
        self.assertEqual(row["causes"][0]["count"], 2)  # the largest cause first

    def test_a_test_jax_does_not_generate_on_the_platform_counts_as_skipped_by_jax(self):
        # JAX draws some tests' parameters by the device (linalg_test's SVD algorithms): a test
        # passing on XLA that pytest did not collect on polyblocks is JAX's skip, not a failure.
        xla = {"svd0": Outcome("passed"), "svd1": Outcome("passed"), "late": Outcome("passed")}
        row = conformance.compare(xla, {"svd0": Outcome("passed")}, collected=["svd0", "late"])
        self.assertEqual((row["eligible"], row["eligible_passed"], row["failed"]), (2, 1, 1))
        self.assertEqual([c["tests"] for c in row["causes"]], [["late"]])  # collected, never run: failed
        self.assertEqual(row["skipped_on_polyblocks_only"][0]["tests"], ["svd1"])

    def test_markdown_lists_files_total_and_causes(self):
        row = conformance.compare({"a": Outcome("passed"), "b": Outcome("passed")},
                                  {"a": Outcome("passed"), "b": Outcome("failed", "ValueError: bad")})
        report = {"requested": ["one_test", "two_test"],
                  "files": {"one_test": {**row, "xla_s": 1.0, "polyblocks_s": 2.0, "errors": []}}}
        text = conformance.format_markdown(report)
        self.assertIn("| one_test | 2 | 2 | 1 | 1 | 0 | 0 | 1 | 2 | 50.0% of 2 |", text)
        self.assertIn("| **total** |", text)
        self.assertIn("not met", text)
        self.assertIn("Not run (yet): two_test.", text)
        self.assertIn("- 1 x `ValueError: bad` (e.g. `b`)", text)


class UpdateTest(absltest.TestCase):
    def test_rows_keep_their_commit_and_new_files_replace_theirs(self):
        row = conformance.compare({"a": Outcome("passed")}, {"a": Outcome("passed")})
        row = {**row, "xla_s": 1.0, "polyblocks_s": 1.0, "errors": []}
        settings = {"cases": 2}
        previous = {"commit": "a" * 40, "settings": settings, "requested": ["one_test", "two_test"],
                    "files": {"one_test": row, "two_test": row}}
        report = conformance.merged(previous, {"commit": "b" * 40, "settings": settings,
                                               "requested": ["two_test", "three_test"], "files": {}})
        report["files"]["two_test"] = {**row, "commit": "b" * 40}
        report["files"]["three_test"] = {**row, "commit": "b" * 40}
        self.assertEqual(list(report["files"]), ["one_test", "two_test", "three_test"])
        self.assertEqual(report["requested"], ["one_test", "two_test", "three_test"])
        text = conformance.format_markdown(report)
        self.assertIn(f"Measured per file at these commits: {'a' * 12}: one_test; {'b' * 12}: two_test, three_test.",
                      text)
        with self.assertRaises(SystemExit):
            conformance.merged(previous, {**report, "settings": {"cases": 3}})


class XlaCacheTest(absltest.TestCase):
    def test_keyed_by_version_file_and_settings_and_round_trips(self):
        root = Path(self.enterContext(tempfile.TemporaryDirectory()))
        test_file = root / "some_test.py"
        test_file.write_text("def test_x(): pass\n")
        settings = {"jax": "0.10.2", "jaxlib": "0.10.2", "cases": 2, "keyword": "", "x64": ""}
        path = conformance.xla_cache_path(root / "cache", test_file, settings)
        self.assertTrue(path.name.startswith("some_test-jax0.10.2-"))
        self.assertNotEqual(path, conformance.xla_cache_path(root / "cache", test_file, settings | {"jax": "0.11.0"}))
        self.assertNotEqual(path, conformance.xla_cache_path(root / "cache", test_file, settings | {"cases": 3}))
        run = conformance.SideRun({"t": Outcome("failed", "m")}, 1.5, 2, ["e"])
        conformance.save_side(path, run)
        self.assertEqual(conformance.load_side(path), run)


if __name__ == "__main__":
    absltest.main()
