"""JAX's own test files on XLA CPU and on polyblocks, test by test, against issue 46's goal.

Each file runs under pytest twice, with ``JAX_PLATFORMS=cpu`` and with
``JAX_PLATFORMS=polyblocks,cpu`` (polyblocks the default backend; the CPU backend beside it,
as a JAX user on any accelerator has it, holds the arguments of JAX's host callbacks) and the same sampling (``JAX_NUM_GENERATED_CASES``; JAX draws
its cases and each test's inputs from fixed seeds, so the two runs test the same cases).
Each run is a subprocess recording outcomes as they happen (bench/conformance_plugin.py):
when the process dies in a test (an abort, a segfault) or stops making progress, that test
counts as crashed and the file continues in a new process without the tests already seen.

The goal: of the tests that pass on XLA CPU and that JAX runs on the platform (not skipped
there, e.g. by its run_on_devices / skip_on_devices marks), at least 99% pass on polyblocks.
Writes conformance-<machine>.json (and a markdown table beside it; where: bench/results_files.py,
``--save``: bench/results/) after
every file: per file the counts and seconds of both sides, and the failing tests grouped by
their error's first line (the cause). XLA's outcomes do not depend on this repository, so
they are cached per jax version, test file and settings; ``--reuse-xla`` reads them back.

    python bench/conformance.py ~/jax/tests                      # the default files
    python bench/conformance.py ~/jax/tests fft_test nn_test -k Fft --results /tmp/c.json
    python bench/conformance.py ~/jax/tests --reuse-xla          # polyblocks' side only
    python bench/conformance.py ~/jax/tests lax_control_flow_test --as-cpu --results /tmp/c.json

``--as-cpu`` runs polyblocks' side as the device JAX's tests call cpu (its ``jax_test_dut``):
the tests JAX keeps for the CPU (``run_on_devices("cpu")``, hundreds in lax_control_flow_test
and api_test) then run on polyblocks too. Wider coverage, not the goal's measure: such a test
may also assert what is particular to XLA CPU.

The tests folder must be the one of the installed jaxlib's tag (jax-v<version>). Its tests
need the ``conformance`` extra (scipy, mpmath, ...): ``pip install -e ".[conformance]"``.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script: make `bench` importable from the repo root
    sys.path.insert(0, str(REPO))
DEFAULT_FILES = ("lax_test", "lax_numpy_operators_test", "lax_numpy_reducers_test", "lax_control_flow_test",
                 "lax_autodiff_test", "lax_vmap_op_test", "nn_test", "random_lax_test", "fft_test", "linalg_test",
                 "debugging_primitives_test", "api_test")
SIDES = {"xla": "cpu", "polyblocks": "polyblocks,cpu"}  # side -> JAX_PLATFORMS
GOAL = 0.99
# A test that writes nothing for this long is taken as hung: its process is killed and the
# test counts as crashed (JAX's slowest tests take minutes on 2 cores, none near this).
DEFAULT_STALL_S = 900
# Causes listed per file in the markdown; the JSON lists them all.
_MD_CAUSES = 12


@dataclasses.dataclass
class Outcome:
    outcome: str          # "passed", "failed", "skipped" or "crashed"
    message: str = ""


@dataclasses.dataclass
class SideRun:
    outcomes: dict[str, Outcome]
    seconds: float
    processes: int = 1                      # one more per crash
    errors: list[str] = dataclasses.field(default_factory=list)  # collection errors, deaths outside a test
    collected: list[str] = dataclasses.field(default_factory=list)  # the tests pytest generated (empty: unknown)


def read_log(path: Path) -> tuple[dict[str, Outcome], list[str], list[str], list[str]]:
    """(outcomes, tests started but never finished, collection errors, tests collected) of a
    plugin log."""
    outcomes: dict[str, Outcome] = {}
    started: list[str] = []
    errors: list[str] = []
    collected: list[str] = []
    if not path.exists():
        return outcomes, started, errors, collected
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by the process's death
            continue
        if "collected" in record:
            collected += record["collected"]
        elif "start" in record:
            started.append(record["start"])
        elif "id" in record:
            outcomes[record["id"]] = Outcome(record["outcome"], record["message"])
        elif "collect_error" in record:
            errors.append(f"collection of {record['collect_error']} failed: {first_line(record['message'])}")
    return outcomes, [t for t in started if t not in outcomes], errors, collected


def death_cause(returncode: int | None, stderr: str, stall_s: float) -> str:
    """Why a process died, as one line: its signal or status, and the native error it printed
    (an LLVM or C assertion) or else where Python's fault handler saw it die (the innermost
    frame, then the innermost two of ours: a helper and its caller); None is a hung process."""
    if returncode is None:
        return f"hung: killed after {stall_s:.0f} s without a test finishing"
    how = f"signal {signal.Signals(-returncode).name}" if returncode < 0 else f"exit status {returncode}"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    native = [line for line in lines if re.search(r"Assertion .* failed|LLVM ERROR|^error:", line)]
    if native:
        return f"crashed ({how}): {native[0]}"
    # faulthandler's dump: "Current thread 0x... (most recent call first):", then its frames
    current = stderr.split("Current thread", 1)[1].split("\n\n", 1)[0] if "Current thread" in stderr else ""
    frames = [f"{_short_path(path)}:{line} {name}"
              for path, line, name in re.findall(r'File "(.+)", line (\d+) in (\S+)', current)]
    ours = [frame for frame in frames if frame.startswith("polyblocks_jax/")]
    where = frames[:1] + [frame for frame in ours[:2] if frame not in frames[:1]]
    return f"crashed ({how})" + (f" in {' from '.join(where)}" if where else "")


def _short_path(path: str) -> str:
    """A path from its package down (site-packages/ or this repository removed)."""
    path = path.split("site-packages/", 1)[-1]
    return path.removeprefix(str(REPO) + "/")


def run_side(test_file: Path, platform: str, pytest_args: list[str], env: dict[str, str], workdir: Path,
             stall_s: float = DEFAULT_STALL_S) -> SideRun:
    """Outcomes of every test of ``test_file`` with ``JAX_PLATFORMS=platform``, continuing
    in a new process after each one that dies in a test."""
    run = SideRun({}, 0.0, processes=0)
    env = dict(env, JAX_PLATFORMS=platform,
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p))
    while True:
        run.processes += 1
        stem = workdir / f"{test_file.stem}-{platform}-{run.processes}"
        skip = stem.with_suffix(".skip")
        skip.write_text("".join(f"{t}\n" for t in run.outcomes))
        log, stderr = stem.with_suffix(".jsonl"), stem.with_suffix(".stderr")
        # no:cacheprovider: nothing is written into JAX's tests folder
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "bench.conformance_plugin",
                   f"--conformance-log={log}", f"--conformance-skip={skip}", test_file.name, *pytest_args]
        start = time.perf_counter()
        with open(stderr, "w") as err:
            returncode = _wait(subprocess.Popen(command, cwd=test_file.parent, env=env, stdout=subprocess.DEVNULL,
                                                stderr=err, start_new_session=True), log, stall_s)
        run.seconds += time.perf_counter() - start
        outcomes, unfinished, errors, collected = read_log(log)
        run.outcomes.update(outcomes)
        run.errors += errors
        run.collected = sorted(set(run.collected) | set(collected))
        if not unfinished:
            # pytest's statuses: 0 all passed, 1 some failed, 2 a collection error (recorded),
            # 5 none collected (all deselected)
            if returncode not in (0, 1, 5) and not (returncode == 2 and errors):
                run.errors.append(death_cause(returncode, stderr.read_text(), stall_s) + " outside a test")
            return run
        cause = death_cause(returncode, stderr.read_text(), stall_s)
        for test in unfinished:
            run.outcomes[test] = Outcome("crashed", cause)


def _wait(process: subprocess.Popen, log: Path, stall_s: float) -> int | None:
    """The process's status, or None when it was killed for writing nothing to ``log`` for
    ``stall_s`` seconds."""
    last, size = time.monotonic(), -1
    while process.poll() is None:
        time.sleep(1.0)
        if log.exists() and log.stat().st_size != size:
            last, size = time.monotonic(), log.stat().st_size
        if time.monotonic() - last > stall_s:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return None
    return process.returncode


def first_line(message: str) -> str:
    """The message's first line that says something (pytest's assertion messages start with
    "AssertionError:" and say what on the next)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if len(lines) > 1 and re.fullmatch(r"[\w.]+(Error|Exception):?", lines[0]):
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def cause_of(message: str) -> str:
    """The first line of an error without what differs between tests of one cause: the
    location ("(at ...)"), tensor dimensions, addresses."""
    line = first_line(message)
    line = re.sub(r" \(at [^)]*\)?.*$", "", line)
    line = re.sub(r"tensor<(\d+x)*", "tensor<…", line)
    line = re.sub(r"0x[0-9a-fA-F]{6,}", "0x…", line)
    return line[:240]


NOT_GENERATED = Outcome("skipped", "Skipped: not generated for polyblocks (JAX draws the test's parameters "
                                   "by the device it runs on)")


def compare(xla: dict[str, Outcome], polyblocks: dict[str, Outcome], collected: Sequence[str] = ()) -> dict:
    """One file's counts and its causes: among the tests passing on XLA CPU that JAX does not
    skip on polyblocks, those that do not pass there, grouped by cause; and the tests passing
    on XLA CPU that JAX skips on polyblocks (or does not generate there: not in ``collected``,
    where that is known), grouped by its reason."""
    missing = Outcome("failed", "not run on polyblocks (its run ended before this test)")
    generated = set(collected)

    def outcome_on_polyblocks(test: str) -> Outcome:
        if test in polyblocks:
            return polyblocks[test]
        return NOT_GENERATED if generated and test not in generated else missing

    on_polyblocks = {t: outcome_on_polyblocks(t) for t, o in xla.items() if o.outcome == "passed"}
    eligible = {t: o for t, o in on_polyblocks.items() if o.outcome != "skipped"}
    failing = {t: o for t, o in eligible.items() if o.outcome != "passed"}
    return {
        "tests": len(set(xla) | set(polyblocks)),
        "xla_passed": _count(xla, "passed"),
        "polyblocks_passed": _count(polyblocks, "passed"),
        "failed": len(failing) - _count(failing, "crashed"),
        "crashed": _count(polyblocks, "crashed"),
        "skipped": _count(polyblocks, "skipped"),
        "eligible": len(eligible),
        "eligible_passed": len(eligible) - len(failing),
        "causes": _group(failing),
        "skipped_on_polyblocks_only": _group({t: o for t, o in on_polyblocks.items() if o.outcome == "skipped"}),
    }


def _count(outcomes: dict[str, Outcome], kind: str) -> int:
    return sum(o.outcome == kind for o in outcomes.values())


def _group(outcomes: dict[str, Outcome]) -> list[dict]:
    """The tests by the cause of their outcome, the largest group first."""
    groups = collections.defaultdict(list)
    for test, outcome in outcomes.items():
        groups[cause_of(outcome.message)].append(test)
    return [{"cause": c, "count": len(ts), "tests": sorted(ts)}
            for c, ts in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def pass_rate(row: dict) -> float | None:
    return row["eligible_passed"] / row["eligible"] if row["eligible"] else None


def merged(previous: dict, report: dict) -> dict:
    """``report`` (about to be filled) holding ``previous``'s rows too, for the same settings:
    files keep their place in the default order, and each row its own commit."""
    if previous.get("settings") != report["settings"]:
        raise SystemExit(f"--update: the results file was measured with {previous.get('settings')}, "
                         f"not {report['settings']}")
    files = {name: {"commit": previous["commit"], **row} for name, row in previous["files"].items()}
    requested = list(dict.fromkeys([*previous["requested"], *report["requested"]]))
    return {**report, "requested": requested, "files": files}


def format_markdown(report: dict) -> str:
    """The per-file table, a total row, then each file's causes."""
    header = ("| file | tests | XLA passed | polyblocks passed | failed (XLA passed) | crashed | skipped "
              "(polyblocks) | XLA s | polyblocks s | pass rate |")
    lines = [header, "|" + " --- |" * header.count(" | ") + " --- |"]
    files = report["files"]
    keys = ("tests", "xla_passed", "polyblocks_passed", "failed", "crashed", "skipped", "eligible", "eligible_passed")
    total = {k: sum(f[k] for f in files.values()) for k in keys + ("xla_s", "polyblocks_s")}
    for name, row in [*files.items(), ("**total**", total)]:
        rate = pass_rate(row)
        cells = [row[k] for k in keys[:6]] + [f"{row['xla_s']:.0f}", f"{row['polyblocks_s']:.0f}",
                                              "-" if rate is None else f"{100 * rate:.1f}% of {row['eligible']}"]
        lines.append(f"| {name} | " + " | ".join(str(c) for c in cells) + " |")
    rate = pass_rate(total)
    commits = collections.defaultdict(list)
    for name, row in files.items():
        commits[row.get("commit", report.get("commit", ""))[:12]].append(name)
    if len(commits) > 1:
        listed = "; ".join(f"{commit}: {', '.join(names)}" for commit, names in commits.items())
        lines[:0] = [f"Measured per file at these commits: {listed}.", ""]
    lines += ["", f"Goal: {100 * GOAL:.0f}% of the tests passing on XLA CPU that JAX runs on the platform; "
              f"{'met' if rate is not None and rate >= GOAL else 'not met'} over these files."]
    pending = [name for name in report["requested"] if name not in files]
    if pending:
        lines += ["", f"Not run (yet): {', '.join(pending)}."]
    for name, row in files.items():
        if not (row["causes"] or row["errors"] or row["skipped_on_polyblocks_only"]):
            continue
        lines += ["", f"### {name}", ""] + [f"- {error}" for error in row["errors"]]
        lines += _format_groups(row["causes"])
        if row["skipped_on_polyblocks_only"]:
            lines += ["", "Passing on XLA CPU, skipped by JAX on polyblocks:", ""]
            lines += _format_groups(row["skipped_on_polyblocks_only"])
    return "\n".join(lines) + "\n"


def _format_groups(groups: list[dict]) -> list[str]:
    lines = [f"- {g['count']} x `{g['cause']}` (e.g. `{g['tests'][0]}`)" for g in groups[:_MD_CAUSES]]
    if len(groups) > _MD_CAUSES:
        rest = groups[_MD_CAUSES:]
        lines.append(f"- {len(rest)} more causes, {sum(g['count'] for g in rest)} tests (in the JSON)")
    return lines


def write_results(report: dict, path: Path) -> str:
    """Writes the report as JSON at ``path`` and its markdown beside it; returns the table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    table = format_markdown(report)
    settings = report["settings"]
    path.with_suffix(".md").write_text(
        f"JAX's tests (jax {settings['jax']}, JAX_NUM_GENERATED_CASES={settings['cases']}"
        f"{', -k ' + settings['keyword'] if settings['keyword'] else ''}) on {report['machine']} ({report['cpu']}), "
        f"commit {report['commit'][:12]}, POLYBLOCKS_FLAGS={report['flags'] or '(default)'}.\n\n{table}")
    return table


def xla_cache_path(cache: Path, test_file: Path, settings: dict) -> Path:
    """Where XLA's outcomes of ``test_file`` under ``settings`` are kept: by jax version,
    file name, and a digest of the file's text and the settings (``as_cpu`` changes only
    polyblocks' side)."""
    xla_settings = {key: value for key, value in settings.items() if key != "as_cpu"}
    digest = hashlib.sha256(test_file.read_bytes() + json.dumps(xla_settings, sort_keys=True).encode()).hexdigest()
    return cache / f"{test_file.stem}-jax{settings['jax']}-{digest[:12]}.json"


def save_side(path: Path, run: SideRun) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = dataclasses.asdict(run)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def load_side(path: Path) -> SideRun:
    data = json.loads(path.read_text())
    data["outcomes"] = {t: Outcome(**o) for t, o in data["outcomes"].items()}
    return SideRun(**data)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", type=Path, help="a copy of JAX's tests/ folder at the installed jaxlib's tag")
    parser.add_argument("files", nargs="*", default=list(DEFAULT_FILES),
                        help="test files, with or without .py (default: %(default)s)")
    parser.add_argument("-k", dest="keyword", default="", help="pytest's -k expression, on both sides")
    parser.add_argument("--cases", type=int, default=2, help="JAX_NUM_GENERATED_CASES (default %(default)s)")
    parser.add_argument("--results", type=Path, default=None,
                        help="the JSON to write, a .md beside it (default conformance-<machine>.json, see --save)")
    parser.add_argument("--reuse-xla", action="store_true",
                        help="read XLA's outcomes from the cache where it has them for these settings")
    parser.add_argument("--xla-cache", type=Path, default=Path.home() / ".cache" / "polyblocks_jax" / "conformance",
                        help="where XLA's outcomes are kept (default %(default)s)")
    parser.add_argument("--save", action="store_true",
                        help="write bench/results/conformance-<machine>.{json,md} (default: bench/results_files.py's folder)")
    parser.add_argument("--update", action="store_true",
                        help="keep the other files' rows of the results file (each row names the commit it was "
                             "measured at); the files run now replace theirs")
    parser.add_argument("--as-cpu", action="store_true",
                        help="on polyblocks' side, run the tests JAX keeps for the CPU (jax_test_dut=cpu)")
    parser.add_argument("--stall", type=float, default=DEFAULT_STALL_S,
                        help="seconds without a test finishing after which a run counts as hung")
    args = parser.parse_args(argv)
    args.files = [f.removesuffix(".py") for f in args.files]
    missing = [f for f in args.files if not (args.tests / f"{f}.py").exists()]
    if missing:
        parser.error(f"not in {args.tests}: {', '.join(missing)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from bench import results_files  # it loads the compiler: not needed by the logic above
    info = results_files.provenance()
    results = args.results or results_files.folder(args.save) / f"conformance-{info['machine']}.json"
    env = dict(os.environ, JAX_NUM_GENERATED_CASES=str(args.cases))
    pytest_args = ["-k", args.keyword] if args.keyword else []
    settings = {"jax": info["versions"]["jax"], "jaxlib": info["versions"]["jaxlib"], "cases": args.cases,
                "keyword": args.keyword, "x64": os.environ.get("JAX_ENABLE_X64", ""),
                **({"as_cpu": True} if args.as_cpu else {})}
    report = {**info, "date": datetime.datetime.now().isoformat(timespec="seconds"), "settings": settings,
              "goal": GOAL, "requested": args.files, "files": {}}
    if args.update and results.exists():
        report = merged(json.loads(results.read_text()), report)
    with tempfile.TemporaryDirectory(prefix="conformance-") as workdir:
        for name in args.files:
            test_file = args.tests.resolve() / f"{name}.py"
            cached = xla_cache_path(args.xla_cache, test_file, settings)
            if args.reuse_xla and cached.exists():
                xla = load_side(cached)
            else:
                xla = run_side(test_file, SIDES["xla"], pytest_args, env, Path(workdir), args.stall)
                save_side(cached, xla)
            polyblocks = run_side(test_file, SIDES["polyblocks"],
                                  pytest_args + (["--conformance-dut=cpu"] if args.as_cpu else []), env,
                                  Path(workdir), args.stall)
            report["files"][name] = {**compare(xla.outcomes, polyblocks.outcomes, polyblocks.collected), "commit": info["commit"],
                                     "xla_s": xla.seconds,
                                     "polyblocks_s": polyblocks.seconds, "processes": polyblocks.processes,
                                     "errors": [f"XLA: {e}" for e in xla.errors]
                                     + [f"polyblocks: {e}" for e in polyblocks.errors]}
            table = write_results(report, results)  # after every file: a run cut short keeps its rows
            print(next(line for line in table.splitlines() if line.startswith(f"| {name} |")), flush=True)
    print(f"wrote {results}")


if __name__ == "__main__":
    main()
