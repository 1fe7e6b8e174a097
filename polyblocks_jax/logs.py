"""Logging: the ``polyblocks_jax`` logger, its level, and what a compile reports.

Every module logs under ``polyblocks_jax``. Its level comes from ``POLYBLOCKS_LOG``
(``debug``, ``info``, ``warning``, ``error``; a handler to stderr is added then, unless
the application configured logging); without it the logger inherits the root logger's,
which absl sets from ``--verbosity`` / ``-v`` where absl is in use. A compile reports one
INFO line with its time, where it ran, whether the cache had it and how many of its objects
the object cache had; a compile still
running after ``PROGRESS_S`` reports its stage at INFO every ``PROGRESS_S``, and once at
WARNING after ``SLOW_S`` (as XLA warns of a slow compile), so a long one is never silent.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import Callable

logger = logging.getLogger("polyblocks_jax")

PROGRESS_S = 2.0
SLOW_S = 30.0
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure() -> None:
    """Apply ``POLYBLOCKS_LOG`` (called once, on import of the package)."""
    name = os.environ.get("POLYBLOCKS_LOG", "").strip().lower()
    if not name:
        return
    if name not in LEVELS:
        logger.warning("POLYBLOCKS_LOG=%s is not one of %s: ignored", name, ", ".join(LEVELS))
        return
    logger.setLevel(LEVELS[name])
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s polyblocks_jax %(levelname)s: %(message)s"))
        logger.addHandler(handler)


def program_name(text: str) -> str:
    """The module's name (``jit_f`` for ``jax.jit(f)``), or ``program``."""
    match = re.search(r"^\s*module\s+@\"?([\w.$-]+)", text, re.M)
    return match.group(1) if match else "program"


def cached_parts(timings: dict[str, float]) -> tuple[int, int]:
    """How many parts of a compile's code the object cache had, and how many parts it had
    (the timings' names that cpu/codegen.py writes: "cached part N", "llc part N")."""
    cached = sum(name.startswith("cached part") for name in timings)
    return cached, cached + sum(name.startswith("llc part") for name in timings)


def objects_note(timings: dict[str, float]) -> str:
    """A compile's report note: the parts of its code that came from the object cache (none: no note)."""
    cached, parts = cached_parts(timings)
    return f"objects cached: {cached} of {parts}" if parts else ""


class CompileReport:
    """One compile's log lines: progress while it runs, then its outcome.

    ``stage(name)`` records the stage under way (any thread), or ``follow(stage_of)`` has it
    read where it is kept (a compile worker's); leaving the ``with`` block logs the time
    taken, and ``note`` if set."""

    def __init__(self, name: str, where: str) -> None:
        self.name, self.where = name, where
        self.note = ""
        self._stage: str | None = None
        self._stage_of: Callable[[], str | None] | None = None
        self._start = time.perf_counter()
        self._done = threading.Event()
        self._watcher: threading.Thread | None = None

    def stage(self, name: str) -> None:
        self._stage = name

    def follow(self, stage_of: Callable[[], str | None]) -> None:
        self._stage_of = stage_of

    @property
    def current(self) -> str | None:
        """The stage under way."""
        return self._stage_of() if self._stage_of is not None else self._stage

    def __enter__(self) -> "CompileReport":
        if logger.isEnabledFor(logging.WARNING):
            self._watcher = threading.Thread(target=self._watch, name="polyblocks-compile-progress", daemon=True)
            self._watcher.start()
        return self

    def __exit__(self, kind, error, traceback) -> None:
        # the watcher finishes before the outcome is logged: no progress line after it
        self._done.set()
        if self._watcher is not None:
            self._watcher.join()
        seconds = time.perf_counter() - self._start
        if error is None:
            logger.info("compiled %s in %.2f s (%s)", self.name, seconds,
                        f"{self.where}; {self.note}" if self.note else self.where)
        else:
            logger.info("compile of %s failed after %.2f s in stage %s: %s", self.name, seconds,
                        self.current or "?", type(error).__name__)

    def _watch(self) -> None:
        warned = False
        while not self._done.wait(PROGRESS_S):
            seconds = time.perf_counter() - self._start
            if seconds >= SLOW_S and not warned:
                warned = True
                logger.warning("compiling %s has taken %.0f s so far (stage %s)", self.name, seconds,
                               self.current or "?")
            else:
                logger.info("compiling %s: %.0f s, stage %s", self.name, seconds, self.current or "?")
