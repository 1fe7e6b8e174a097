"""Compile workers: processes that compile for this one, started on demand and kept warm.

A worker is ``python -m polyblocks_jax.compile_workers.worker``, not a multiprocessing
child: "spawn" and "forkserver" would run the user's unguarded top-level script again in
the child, and "fork" copies a process whose JAX threads may hold locks. Jobs and replies
travel on two pipes of their own; the worker's stdout and stderr, merged, are forwarded to
this process's stderr, their last lines kept for a crash report. A worker runs in a session
of its own, so that Ctrl-C at a terminal interrupts the compile here, which then ends it.
"""
from __future__ import annotations

import atexit
import collections
import logging
import os
import subprocess
import sys
import threading
from typing import Callable

import polyblocks_jax
from polyblocks_jax import targets
from polyblocks_jax.compile_workers import crashes, protocol
from polyblocks_jax.targets import CompiledProgram

logger = logging.getLogger(__name__)

_OUTPUT_LINES = 60            # of a worker's output, kept for the report of its crash
_MEMORY_POLL_S = 0.05         # between two reads of a worker's resident memory
_EXIT_WAIT_S = 10             # for a worker that closed its pipe to exit, before it is killed


class Worker:
    """One compile process; one job at a time."""

    def __init__(self, memory_limit: int, host_llvm: bool = True) -> None:
        job_out, job_in = os.pipe()
        reply_out, reply_in = os.pipe()
        self._stage, stage_fd = protocol.StageSlot.create()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-X", "faulthandler", "-m", "polyblocks_jax.compile_workers.worker",
                 str(job_out), str(reply_in), str(stage_fd), "host" if host_llvm else "plain"],
                pass_fds=(job_out, reply_in, stage_fd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=_environment(), start_new_session=True)
        except BaseException:
            os.close(job_in)
            os.close(reply_out)
            raise
        finally:  # the worker's ends
            os.close(job_out)
            os.close(reply_in)
            os.close(stage_fd)
        self._jobs, self._replies = protocol.writer(job_in), protocol.reader(reply_out)
        self.memory_limit = memory_limit
        self.memory_exceeded: int | None = None  # the resident bytes it was stopped at
        self._job_running = False
        self._job_started = threading.Event()  # wakes the memory watcher from its idle wait
        self.ready = False
        self._output: collections.deque[bytes] = collections.deque(maxlen=_OUTPUT_LINES)
        self._forwarder = threading.Thread(target=self._forward_output, name="polyblocks-compile-worker-output",
                                           daemon=True)
        self._forwarder.start()
        if memory_limit:
            threading.Thread(target=self._watch_memory, name="polyblocks-compile-worker-memory",
                             daemon=True).start()

    @property
    def stage(self) -> str | None:
        """The stage of the job under way (or of the last job), as the worker wrote it."""
        return self._stage.read()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None and not self._jobs.closed

    def start_failure(self) -> str | None:
        """Wait until the worker has imported the compiler: None, or why it cannot compile."""
        if self.ready:
            return None
        try:
            kind, device_kind = self._replies.recv()
        except (EOFError, OSError):
            code = self._exit_code()
            self._forwarder.join(timeout=2)
            output = self._output_text().rstrip()
            return f"it ended ({crashes.death(code)}) before it was ready" + (f":\n{output}" if output else "")
        from polyblocks_jax.cpu.target import host
        if kind != protocol.READY or device_kind != host().description():
            self.kill()
            return f"it sees another CPU ({device_kind!r}, this process {host().description()!r})"
        self.ready = True
        return None

    def compile(self, job: protocol.Job, text: str,
                follow: Callable[[Callable[[], str | None]], None] | None = None) -> CompiledProgram:
        """Run ``job``; raises what the compile raised, or a CompilationError if the worker died.
        ``follow`` is given the function that reads the stage under way."""
        self._stage.write(None)
        self._output.clear()
        self._job_running = True
        self._job_started.set()
        if follow is not None:
            follow(self._stage.read)
        try:
            self._jobs.send(job)
            reply = self._replies.recv()
        except (EOFError, OSError):
            raise self._crash_error(job, text) from None
        except BaseException:  # interrupted here: the worker's state is unknown
            self.kill()
            raise
        finally:
            self._job_running = False
        if reply[0] == protocol.ERROR:
            raise protocol.decode_error(reply[1], self.stage or "worker")
        exe = targets.get(job.target).deserialize(reply[1])
        exe.timings = reply[2]
        return exe

    def close(self) -> None:
        """No more jobs: the worker exits when it reads the end of its pipe."""
        self._jobs.close()
        self._replies.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.close()


    def _crash_error(self, job: protocol.Job, text: str) -> BaseException:
        code = self._exit_code()
        self._forwarder.join(timeout=2)  # the last of the output, the crash's own message
        try:
            reproducer = crashes.save_reproducer(text, job.source, job.options, job.donate_argnums, job.key)
        except OSError as e:
            reproducer = f"(not saved: {e})"
        self.close()
        if self.memory_exceeded is not None:
            return crashes.memory_error(self.stage or "worker", self.memory_exceeded, self.memory_limit, reproducer)
        return crashes.crash_error(self.stage or "worker", code, self._output_text(), reproducer)

    def _exit_code(self) -> int:
        try:
            return self.process.wait(timeout=_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def _output_text(self) -> str:
        return b"".join(self._output).decode(errors="replace")

    def _watch_memory(self) -> None:
        """Stop the worker once its resident memory passes the limit: a compile that runs
        away (an exponential fusion, a huge constant) then fails alone, before the machine
        swaps or the kernel's OOM killer picks a victim (perhaps the user's process)."""
        page = os.sysconf("SC_PAGE_SIZE")
        while self.process.poll() is None:
            try:
                with open(f"/proc/{self.pid}/statm") as f:
                    resident = int(f.read().split()[1]) * page
            except (OSError, ValueError, IndexError):  # exited, or no /proc here
                return
            if resident > self.memory_limit and self._job_running:
                self.memory_exceeded = resident
                self.process.kill()
                return
            # Idle, it polls seldom; a job wakes it at once (a small program compiles in less
            # than the idle wait).
            if self._job_started.wait(_MEMORY_POLL_S if self._job_running else 10 * _MEMORY_POLL_S):
                self._job_started.clear()

    def _forward_output(self) -> None:
        stream = self.process.stdout
        try:
            for line in iter(stream.readline, b""):
                self._output.append(line)
                try:
                    os.write(2, line)
                except OSError:  # no stderr left: the line is still kept
                    pass
        except (OSError, ValueError):  # closed under us (a forked child forgetting it)
            pass


class Pool:
    """Up to ``size`` workers, started when a job finds none idle; thread safe.

    ``unavailable`` says why no worker can start (logged once): jobs then compile in process."""

    def __init__(self, size: int, host_llvm: bool = True) -> None:
        self.size, self.host_llvm = size, host_llvm
        self.memory_limit = memory_limit(size)
        self.unavailable: str | None = None
        self._idle: list[Worker] = []
        self._busy: set[Worker] = set()
        self._changed = threading.Condition()

    def compile(self, job: protocol.Job, text: str,
                follow: Callable[[Callable[[], str | None]], None] | None = None) -> CompiledProgram | None:
        """Compile ``job`` in a worker (``follow``: see ``Worker.compile``); None if no worker can start."""
        worker = self._acquire()
        if worker is None:
            return None
        try:
            failure = worker.start_failure()
            if failure is not None:
                self._give_up(failure)
                return None
            return worker.compile(job, text, follow)
        finally:
            self._release(worker)

    def prestart(self) -> None:
        """Start a worker now, if none is: it imports the compiler while this process goes on."""
        with self._changed:
            if not self._idle and not self._busy and self.unavailable is None:
                worker = self._spawn()
                if worker is not None:
                    self._idle.append(worker)

    def busy(self) -> list[Worker]:
        with self._changed:
            return list(self._busy)

    def close(self) -> None:
        with self._changed:
            for worker in self._idle:
                worker.close()
            self._idle.clear()

    def forget_after_fork(self) -> None:
        """A forked child shares its parent's workers' pipes: it must not use them."""
        self._changed = threading.Condition()
        for worker in (*self._idle, *self._busy):
            worker.close()  # (its output stream stays: its lock may be held by a thread the child lacks)
        self._idle, self._busy = [], set()

    def _acquire(self) -> Worker | None:
        with self._changed:
            while self.unavailable is None:
                while self._idle:
                    worker = self._idle.pop()
                    if worker.alive:
                        self._busy.add(worker)
                        return worker
                    worker.close()  # died idle (killed from outside): not this job's crash
                if len(self._busy) < self.size:
                    worker = self._spawn()
                    if worker is not None:
                        self._busy.add(worker)
                    return worker
                self._changed.wait()
            return None

    def _release(self, worker: Worker) -> None:
        with self._changed:
            self._busy.discard(worker)
            if worker.alive:
                self._idle.append(worker)
                self._changed.notify()
                return
            worker.close()
            if self.unavailable is None:  # crashed or interrupted: a fresh one, warm by the next job
                replacement = self._spawn()
                if replacement is not None:
                    self._idle.append(replacement)
            self._changed.notify()

    def _spawn(self) -> Worker | None:
        try:
            return Worker(self.memory_limit, self.host_llvm)
        except OSError as e:
            self._give_up(f"it does not start: {e}")
            return None

    def _give_up(self, reason: str) -> None:
        with self._changed:
            if self.unavailable is None:
                self.unavailable = reason
                logger.warning("polyblocks_jax compiles in this process, where a crash of MLIR or LLVM "
                               "ends it: no compile worker (%s)", reason)
            self._changed.notify_all()


def _environment() -> dict[str, str]:
    """This process's environment, with this very polyblocks_jax first on the worker's path."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(polyblocks_jax.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"  # a line printed before a crash is not lost in a buffer
    return env


def memory_limit(workers: int) -> int:
    """Resident bytes each of ``workers`` compile workers may hold: together within 80% of
    the physical memory, and at least 4 GiB; ``POLYBLOCKS_WORKER_MEMORY_GB`` sets it
    instead. 0: no limit."""
    override = os.environ.get("POLYBLOCKS_WORKER_MEMORY_GB")
    if override:
        return int(float(override) * 2 ** 30)
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # not on this system: no limit
        return 0
    return max(4 * 2 ** 30, int(0.8 * physical / max(1, workers)))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this system
        return os.cpu_count() or 1


POOLS = {"host": Pool(_cores()), "plain": Pool(_cores(), host_llvm=False)}
POOL = POOLS["host"]
for _pool in POOLS.values():
    atexit.register(_pool.close)
    os.register_at_fork(after_in_child=_pool.forget_after_fork)
