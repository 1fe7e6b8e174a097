"""The benchmarks' results files: written outside the tracked tree unless --save, each
recording the commit, flags, versions and CPU it was measured with."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from absl.testing import absltest

from bench import results_files, runner

REPO = Path(__file__).resolve().parents[1]


class ResultsFilesTest(absltest.TestCase):
    def test_provenance_names_commit_versions_flags_and_cpu(self):
        info = results_files.provenance()
        self.assertRegex(info["commit"], r"^[0-9a-f]{40}(-dirty)?$")
        for package in ("jax", "jaxlib", "polyblocks-jax"):
            self.assertIn(package, info["versions"])
        self.assertIn("flags", info)
        self.assertTrue(info["cpu"] and info["cpu_features"] and info["machine"])

    def test_a_run_writes_outside_the_tree_and_save_into_it(self):
        with tempfile.TemporaryDirectory() as scratch:
            env = dict(os.environ, POLYBLOCKS_BENCH_RESULTS=scratch, JAX_PLATFORMS="polyblocks,cpu")
            done = subprocess.run([sys.executable, "bench/programs.py", "--programs", "clip", "--repeat", "2"],
                                  cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
            self.assertEqual(done.returncode, 0, done.stderr[-2000:])
            written = Path(scratch) / f"programs-{results_files.machine_slug()}.json"
            self.assertIn(f"wrote {written}", done.stdout)
            report = json.loads(written.read_text())
            self.assertEqual(report["commit"], results_files.provenance()["commit"])
            self.assertEqual([row["op"] for row in report["rows"]], ["clip"])
            (row,) = report["rows"]  # each round's median kept: the chart's whiskers, the spread
            self.assertLen(row["pb_ms_rounds"], runner.ROUNDS)
            self.assertAlmostEqual(row["pb_ms"], min(row["pb_ms_rounds"]))
            self.assertTrue(written.with_suffix(".png").exists())
        self.assertEqual(results_files.folder(save=True), REPO / "bench" / "results")

    def test_paired_latency_reports_each_sides_best_round_and_the_rounds_ratios(self):
        paired = runner.PairedLatency(xla_rounds=[2.0, 3.0, 2.5], pb_rounds=[1.0, 2.0, 1.25])
        self.assertEqual((paired.xla_s, paired.pb_s), (2.0, 1.0))
        self.assertEqual(paired.ratio_spread(), (1.5, 2.0))

    def test_compile_benchmark_tables_models_cold_and_warm_and_the_eager_set(self):
        from bench import compile as bench_compile
        report = {**results_files.provenance(), "date": "d", "quick": True, "models": [
            {"model": "resnet18", "workers_s": 1.5, "rows": [
                {"batch": 1, "cache": "cold", "xla_s": 1.0, "pb_s": 1.5, "ratio": 1.5},
                {"batch": 8, "cache": "warm", "xla_s": 1.0, "pb_s": 0.5, "ratio": 0.5}]}],
            "eager": {"ops": 40, "first_calls_s": {"xla": 2.0, "polyblocks": 3.0},
                      "compile_median_s": {"xla": 0.02, "polyblocks": 0.03}}}
        text = bench_compile.markdown(report)
        self.assertIn("| resnet18 | 1 | cold | 1.00 | 1.50 | 1.50 |", text)
        self.assertIn("| resnet18 | 8 | warm | 1.00 | 0.50 | 0.50 |", text)
        self.assertIn("first calls 2.00 s on XLA, 3.00 s on polyblocks (1.50x)", text)
        self.assertLen(bench_compile.EAGER_OPS, 40)


if __name__ == "__main__":
    absltest.main()
