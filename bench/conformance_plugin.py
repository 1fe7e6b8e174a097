"""A pytest plugin for bench/conformance.py: every test's start and outcome, one JSON line each.

Lines are written and flushed as tests run, not at the session's end (as --junitxml is), so
a process that aborts mid-file still leaves the outcomes so far and, as a start without an
outcome, the test it died in. ``--conformance-skip`` names a file of test ids to deselect:
a rerun after a crash continues with the tests not yet reported.

    python -m pytest -p bench.conformance_plugin --conformance-log out.jsonl FILE
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

# Failure messages kept per test: the cause is their first lines, the rest is for reading.
_MESSAGE_CHARS = 2000


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance")
    group.addoption("--conformance-log", help="write each test's start and outcome here, as JSON lines")
    group.addoption("--conformance-skip", help="a file of test ids, one a line, to deselect")
    group.addoption("--conformance-dut", help="the device JAX's test_util takes as under test (its jax_test_dut)")


def pytest_configure(config: pytest.Config) -> None:
    log = config.getoption("conformance_log")
    if log:
        skip = config.getoption("conformance_skip")
        ids = set(Path(skip).read_text().splitlines()) if skip else set()
        config.pluginmanager.register(Recorder(Path(log), ids), "conformance-recorder")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config) -> None:
    # After collection: the test files have imported JAX's test_util, which defines the
    # option (absl would read it from the command line, which pytest's parser refuses).
    # Each test's device marks (run_on_devices, skip_on_devices) are read as it runs.
    dut = config.getoption("conformance_dut")
    if dut:
        import jax
        jax.config.update("jax_test_dut", dut)


class Recorder:
    def __init__(self, log: Path, skip: set[str]):
        self.log = log.open("a", buffering=1)  # line-buffered: each record reaches the file whole
        self.skip = skip
        self.reports: dict[str, list[pytest.TestReport]] = {}

    def _write(self, record: dict) -> None:
        self.log.write(json.dumps(record) + "\n")
        self.log.flush()

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        # What JAX generated on this platform: its parameters can depend on the device.
        self._write({"collected": [item.nodeid for item in items]})
        dropped = [item for item in items if item.nodeid in self.skip]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if item.nodeid not in self.skip]

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self._write({"collect_error": report.nodeid, "message": str(report.longrepr)[-_MESSAGE_CHARS:]})

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.reports[nodeid] = []
        self._write({"start": nodeid})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reports.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        outcome, message = _outcome(self.reports.pop(nodeid, []))
        self._write({"id": nodeid, "outcome": outcome, "message": message})

    def pytest_unconfigure(self) -> None:
        self.log.close()


def _outcome(reports: list[pytest.TestReport]) -> tuple[str, str]:
    """("passed" | "failed" | "skipped", message) of one test's setup, call and teardown
    reports (and subtests'): a failure in any of them fails the test."""
    for report in reports:
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            text = crash.message if crash is not None else str(report.longrepr)
            return "failed", text[:_MESSAGE_CHARS]
    for report in reports:
        if report.skipped:
            # An expected failure is no pass: it counts with the tests JAX does not run here.
            if hasattr(report, "wasxfail"):
                return "skipped", f"xfail: {report.wasxfail}"
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            return "skipped", reason[:_MESSAGE_CHARS]
    return "passed", ""
