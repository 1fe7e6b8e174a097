"""Where the benchmarks write their results, and what every results file records.

A run writes under ``~/.cache/polyblocks_jax/bench-results/`` (``POLYBLOCKS_BENCH_RESULTS``
sets another folder), so that trying a benchmark never dirties a clone nor overwrites the
committed figures; ``--save`` writes into ``bench/results/``, the current set per machine
kind. Every file starts from ``provenance()``: the commit, the flags, the versions, the
CPU and its features, so a figure can be traced to what produced it.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "bench" / "results"
SCRATCH = Path(os.environ.get("POLYBLOCKS_BENCH_RESULTS", Path.home() / ".cache" / "polyblocks_jax" / "bench-results"))
PACKAGES = ("jax", "jaxlib", "polyblocks-jax", "flax", "numpy", "xtc-mlir-python-bindings", "pytest")


def add_save_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--save", action="store_true",
                        help=f"write into {COMMITTED.relative_to(REPO)}/ (the committed results) instead of {SCRATCH}")


def folder(save: bool) -> Path:
    """The folder a run writes into (created)."""
    path = COMMITTED if save else SCRATCH
    path.mkdir(parents=True, exist_ok=True)
    return path


def _cpuinfo(field: str) -> str | None:
    """The first value of ``field`` in /proc/cpuinfo, or None."""
    try:
        with open("/proc/cpuinfo") as f:
            match = re.search(rf"^{field}\s*:\s*(.+)$", f.read(), re.M)
    except OSError:
        return None
    return match.group(1).strip() if match else None


def cpu_name() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine_slug() -> str:
    """A short name for the host: first two words of the CPU model, its family, the core
    count and the vector width (a virtual machine's "AMD EPYC" covers Zen 3, 4 and 5: Zen 5
    is family 26 and issues twice Zen 4's AVX-512 FMAs)."""
    from polyblocks_jax.cpu import target
    words = re.sub(r"\((R|TM|tm)\)", "", cpu_name()).lower().split()
    words = [re.sub(r"[^a-z0-9]+", "", w) for w in words]
    family = _cpuinfo("cpu family")
    return "-".join([w for w in words if w][:2] + ([f"fam{family}"] if family else [])
                    + [f"{cores()}c", target.host().vector_isa])


def provenance() -> dict:
    """The machine, commit, versions and flags a run measured with."""
    from polyblocks_jax.cpu import target

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""
    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results")  # results aren't code
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    host = target.host()
    return {
        "machine": machine_slug(), "cpu": cpu_name(), "cores": cores(),
        "device_kind": host.description(), "cpu_features": sorted(host.features),
        "commit": commit + ("-dirty" if dirty else ""), "versions": versions,
        "flags": os.environ.get("POLYBLOCKS_FLAGS", ""), "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "load_average": load_average(),
    }


def load_average() -> list[float]:
    """The machine's 1, 5 and 15-minute load averages: on a shared machine, how loaded it was."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else []
