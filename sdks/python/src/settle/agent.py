"""An agent: serves one agent queue of a Settle server with a Python function per
(machine, action), with leases, heartbeats, reports and a graceful stop handled."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Optional, Tuple

from .client import MAX_LEASE, Client, Problem, Unreachable
from .outcome import Fail, Outcome, OutcomeError
from .task import Task

log = logging.getLogger("settle.agent")

Action = Callable[[Task], Outcome]


class Agent:
    """Serves `queue` of the server at `client`: leases tasks (a long poll), runs the
    function registered for each task's machine and action on a pool of `concurrency`
    threads, heartbeats while it runs, and reports what it returns.

    ```python
    agent = Agent(Client("http://127.0.0.1:7400"), queue="provider")

    @agent.action("server", "create_resources")
    def create_resources(task: Task) -> Outcome:
        return Outcome.to("creating_resources").create("app", f"{task.key}-app", event="start")

    agent.run()   # until SIGTERM or SIGINT: finishes the tasks under way, then returns
    ```

    A function returns an [`Outcome`] (reported with `complete`), or raises [`Fail`]
    (reported with `fail`); any other exception is reported as a retryable `fail` with its
    message, and logged. `"*"` as the machine or the action registers a function for any:
    a task runs the function of its machine and action, else of its machine and `"*"`, else
    of `"*"` and its action, else of `"*"` and `"*"`. A task with none is failed, retryable,
    naming what is missing.

    Each task is logged (logger `settle.agent`, INFO) as one line naming it and what was
    reported: `task 7 server/web-1 provision (attempt 1): complete -> ready {"endpoint": …}
    in 412ms`, `…: fail, retryable: provider unavailable in 95ms`. A lease the server
    refuses for good (401, 403, an unknown queue) stops the agent; `refusal` then holds it.
    """

    def __init__(self, client: Client, queue: str, name: Optional[str] = None, concurrency: int = 8,
                 poll_wait_s: float = 10.0) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 < poll_wait_s <= 3600:
            raise ValueError("poll_wait_s must be more than 0 and at most 3600 seconds")
        self.client = client
        self.queue = queue
        self.name = name or f"python-agent-{socket.gethostname()}-{os.getpid()}"
        self.concurrency = concurrency
        self.poll_wait_s = poll_wait_s
        self.actions: Dict[Tuple[str, str], Action] = {}
        self.stopping = threading.Event()
        self.counts: Dict[str, int] = {"leased": 0, "completed": 0, "failed": 0, "refused": 0, "lost": 0}
        self._slots = threading.BoundedSemaphore(concurrency)
        self._lock = threading.Lock()
        self._running: Dict[int, Task] = {}
        self._idle = threading.Condition(self._lock)
        self._last_work = time.monotonic()
        self.refusal: Optional[Problem] = None

    def action(self, machine: str, action: str) -> Callable[[Action], Action]:
        """Registers the decorated function for `machine`'s `action`."""

        def register(f: Action) -> Action:
            self.register(machine, action, f)
            return f

        return register

    def register(self, machine: str, action: str, f: Action) -> None:
        """Registers `f` for `machine`'s `action`."""
        if (machine, action) in self.actions:
            raise ValueError(f"{machine}.{action} is registered twice")
        self.actions[(machine, action)] = f

    def stop(self) -> None:
        """Stops leasing; tasks under way finish and are reported."""
        self.stopping.set()

    # -- the loop -----------------------------------------------------------------------

    def run(self, handle_signals: bool = True, once_idle_for: Optional[float] = None) -> None:
        """Serves the queue until [`stop`], SIGTERM or SIGINT (a second signal quits at once),
        or, with `once_idle_for`, until no task was leased or worked on for that long."""
        if handle_signals and threading.current_thread() is threading.main_thread():
            def on_signal(signum, _frame):
                if self.stopping.is_set():
                    log.warning("stopping now, without finishing")
                    os._exit(1)
                log.info("%s: stopping (finishing the tasks under way; again to quit now)",
                         signal.Signals(signum).name)
                self.stop()

            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
        log.info("agent %s serving queue `%s` of %s", self.name, self.queue, self.client.server)
        # A fixed pool of workers, each keeping its connection alive across tasks.
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"{self.queue}-worker")
        leaser = threading.Thread(target=self._serve, args=(once_idle_for,), name=f"lease-{self.queue}", daemon=True)
        beats = threading.Thread(target=self._heartbeats, name=f"heartbeat-{self.queue}", daemon=True)
        leaser.start()
        beats.start()
        try:
            # The calling thread only waits, so that signals are handled at once.
            while leaser.is_alive():
                leaser.join(0.2)
            with self._lock:
                while self._running:
                    self._idle.wait(0.2)
        finally:
            self._pool.shutdown(wait=False)
        log.info("agent %s stopped: %s", self.name, self.counts)

    def _function(self, task: Task) -> Optional[Action]:
        for key in ((task.machine, task.action), (task.machine, "*"), ("*", task.action), ("*", "*")):
            if key in self.actions:
                return self.actions[key]
        return None

    def _serve(self, once_idle_for: Optional[float]) -> None:
        backoff = 0.5
        unreachable_since: Optional[float] = None
        while not self.stopping.is_set():
            if once_idle_for is not None and self._idle_for() >= once_idle_for:
                log.info("no task for %gs: stopping", once_idle_for)
                self.stop()
                break
            # Lease only what there is room for: a leased task nobody works on would only
            # wait for its lock to run out.
            if not self._slots.acquire(timeout=0.2):
                continue
            free = 1
            while free < MAX_LEASE and self._slots.acquire(blocking=False):
                free += 1
            wait = self.poll_wait_s
            if once_idle_for is not None:
                wait = max(0.05, min(wait, once_idle_for - self._idle_for()))
            try:
                tasks = self.client.lease(self.queue, self.name, free, wait)
            except (Unreachable, Problem) as e:
                self._release(free)
                if isinstance(e, Problem) and e.status < 500 and e.status != 429:
                    log.error("lease refused, stopping: %s", e)
                    self.refusal = e
                    self.stop()
                    break
                delay = backoff
                if isinstance(e, Problem):
                    delay = _retry_after(e, backoff)
                    log.warning("lease refused (%s), retrying in %.1fs", e, delay)
                else:
                    unreachable_since = unreachable_since or time.monotonic()
                    down = time.monotonic() - unreachable_since
                    since = f", for {down:.0f}s" if down >= 1 else ""
                    log.warning("server unreachable (%s%s), retrying in %.1fs", e, since, delay)
                if once_idle_for is not None:
                    delay = min(delay, max(once_idle_for - self._idle_for(), 0.0))
                self.stopping.wait(delay)
                backoff = min(backoff * 2, 10.0)
                continue
            if unreachable_since is not None:
                log.info("server reachable again after %.0fs", time.monotonic() - unreachable_since)
            unreachable_since, backoff = None, 0.5
            self._release(free - len(tasks))
            with self._lock:
                self.counts["leased"] += len(tasks)
                if tasks:
                    self._last_work = time.monotonic()
                for task in tasks:
                    self._running[task.id] = task
            for task in tasks:
                self._pool.submit(self._run_task, task)

    def _idle_for(self) -> float:
        with self._lock:
            return 0.0 if self._running else time.monotonic() - self._last_work

    def _release(self, n: int) -> None:
        for _ in range(n):
            self._slots.release()

    def _heartbeats(self) -> None:
        """Extends every running task's lease when a third of its lock is left to run."""
        while True:
            time.sleep(0.1)
            with self._lock:
                running = list(self._running.values())
            now_ms = int(time.time() * 1000)
            for task in running:
                if task.lost.is_set() or task.locked_until - now_ms > task.lock_ms * 2 / 3:
                    continue
                try:
                    self.client.heartbeat(task)
                except Problem as e:
                    log.warning("task %s %s/%s: lease lost: %s", task.id, task.machine, task.key, e)
                    task.lost.set()
                except Unreachable as e:
                    log.warning("task %s: heartbeat failed, retrying: %s", task.id, e)

    # -- one task -----------------------------------------------------------------------

    def _run_task(self, task: Task) -> None:
        # A report leases the next task in the same request: this worker goes on with it
        # (one round trip per task while the queue has work).
        current: Optional[Task] = task
        try:
            while current is not None:
                done, current = current, None
                try:
                    current = self._work_on(done)
                finally:
                    with self._lock:
                        self._running.pop(done.id, None)
                        if current is not None:
                            self.counts["leased"] += 1
                            self._running[current.id] = current
        except Exception:  # a bug must not kill the agent or leak its slot
            log.exception("task %s: the agent failed", task.id)
        finally:
            self._slots.release()
            with self._lock:
                self._running.pop(task.id, None)
                self._last_work = time.monotonic()
                self._idle.notify_all()

    def _work_on(self, task: Task) -> Optional[Task]:
        """Runs and reports `task`; answers the next task the report leased, if any."""
        what = f"task {task.id} {task.machine}/{task.key} {task.action} (attempt {task.attempt})"
        started = time.monotonic()
        f = self._function(task)
        outcome: Optional[Outcome] = None
        if f is None:
            known = ", ".join(sorted(f"{m}.{a}" for m, a in self.actions)) or "none"
            failure = Fail(f"agent {self.name} has no function for {task.machine}.{task.action} "
                           f"(it serves: {known})", retryable=True)
        else:
            try:
                result = f(task)
                if not isinstance(result, Outcome):
                    raise OutcomeError(f"{task.machine}.{task.action} returned {type(result).__name__}, not an Outcome")
                outcome, failure = result, None
            except Fail as e:
                failure = e
            except Exception as e:
                log.exception("%s: the action raised", what)
                failure = Fail(f"{type(e).__name__}: {e}", retryable=True)
        took = f"{(time.monotonic() - started) * 1000:.0f}ms"
        if task.lost.is_set():
            with self._lock:
                self.counts["lost"] += 1
            log.info("%s: lease lost while it ran (%s), not reported", what, took)
            return None
        # Ask for the next task with the report, unless stopping.
        nxt = None if self.stopping.is_set() else {"queue": self.queue, "agent": self.name, "max": 1}
        try:
            if outcome is not None:
                answer = self._send(task, lambda: self.client.complete(task, outcome, next=nxt))
                kind, said = "completed", f"complete -> {outcome.describe()}"
            else:
                answer = self._send(task, lambda: self.client.fail(task, failure.error, failure.retryable, next=nxt))
                kind = "failed"
                said = f"fail, {'retryable' if failure.retryable else 'not retryable'}: {failure.error}"
        except Problem as e:
            # Refused (the lease expired, the entity moved on, or the report is beyond the
            # action's declaration): nothing changed.
            with self._lock:
                self.counts["refused"] += 1
            # A 409 is the protocol at work (the lease ran out, or the entity moved on, e.g.
            # deleted meanwhile); anything else is a report this agent got wrong.
            level = logging.INFO if e.status == 409 else logging.WARNING
            log.log(level, "%s: report refused after %s: %s", what, took, e)
            return None
        except Unreachable as e:
            with self._lock:
                self.counts["lost"] += 1
            log.warning("%s: report lost, server unreachable: %s", what, e)
            return None
        with self._lock:
            self.counts[kind] += 1
        log.info("%s: %s in %s", what, said, took)
        leased = answer.get("tasks") or []
        return leased[0] if leased else None

    def _send(self, task: Task, send: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        """Sends a report, again while the server is unreachable and the lease lasts (a
        repeat of a report that landed is a replay and changes nothing)."""
        delay = 0.2
        while True:
            try:
                return send()
            except Unreachable:
                if task.lease_left_ms() <= delay * 1000:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)


def _retry_after(problem: Problem, default: float) -> float:
    """The delay a 429 or 503 asks for (`Retry-After`, in seconds), else `default`."""
    try:
        return max(float(problem.retry_after or ""), 0.1)
    except ValueError:
        return default
