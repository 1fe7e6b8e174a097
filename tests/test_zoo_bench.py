"""The benchmark zoo (bench/zoo_bench.py): every workload builds and traces, a few small ones
match XLA, a run writes its tables, and --busy's spinner stays on its core and ends with it."""
import collections
import json
import os
import tempfile
import time
from pathlib import Path
from unittest import mock

import jax
from absl.testing import absltest, parameterized

from bench import results_files, zoo_bench

BY_NAME = {w.name: w for w in zoo_bench.WORKLOADS}


class ZooWorkloadsTest(parameterized.TestCase):
    def test_at_least_twenty_models_and_twenty_programs_with_unique_names(self):
        kinds = collections.Counter(w.kind for w in zoo_bench.WORKLOADS)
        self.assertGreaterEqual(kinds["model"], 20)
        self.assertGreaterEqual(kinds["program"], 20)
        self.assertEqual(len(BY_NAME), len(zoo_bench.WORKLOADS))

    def test_every_workload_builds_and_traces(self):
        for w in zoo_bench.WORKLOADS:
            with self.subTest(w.name):
                fn, args = w.build(1, False)
                self.assertTrue(jax.tree_util.tree_leaves(jax.eval_shape(fn, *args)))

    @parameterized.parameters("gather_rows", "matmul_int8", "tcn", "gru_seq128")
    def test_small_workload_matches_xla(self, name):
        row, xla, pbc = zoo_bench.compile_and_check(BY_NAME[name], 1, False)
        self.assertEqual(row.error, "")
        self.assertTrue(row.correct, row)
        self.assertIsNotNone(xla)
        self.assertIsNotNone(pbc)


class ZooBenchTest(absltest.TestCase):
    def test_a_run_writes_json_and_markdown_with_a_table_per_batch(self):
        with tempfile.TemporaryDirectory() as scratch, mock.patch.object(results_files, "SCRATCH", Path(scratch)):
            zoo_bench.main(["--only", "cumsum", "--batch", "1,2", "--repeat", "3"])
            path = Path(scratch) / f"zoo-{results_files.machine_slug()}-partial.json"
            report = json.loads(path.read_text())
            markdown = path.with_suffix(".md").read_text()
        self.assertEqual(set(report["batches"]), {"1", "2"})
        for batch in report["batches"].values():
            (row,) = batch["rows"]
            self.assertTrue(row["correct"], row)
            self.assertAlmostEqual(row["ratio"], row["xla_ms"] / row["pb_ms"])
            self.assertAlmostEqual(batch["geomean_programs"], row["ratio"])
        self.assertIn("load_average", report)
        self.assertIn("## Batch 2", markdown)
        self.assertIn("| cumsum | program |", markdown)

    def test_busy_core_spins_pinned_to_the_last_core_until_the_block_ends(self):
        with zoo_bench.busy_core() as (core, pid):
            self.assertEqual(core, max(os.sched_getaffinity(0)))
            deadline = time.monotonic() + 10
            while os.sched_getaffinity(pid) != {core} and time.monotonic() < deadline:
                time.sleep(0.05)  # the spinner pins itself once Python has started
            self.assertEqual(os.sched_getaffinity(pid), {core})
        with self.assertRaises(ProcessLookupError):
            os.kill(pid, 0)


if __name__ == "__main__":
    absltest.main()
