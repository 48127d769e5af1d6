#!/usr/bin/env python3
"""An external Settle agent in Python, standard library only (DESIGN §5).

It serves one agent queue of a `settle serve` with a simulated provider, as `settle agent`
(crates/cli/src/agent.rs) does, and shows that agents need nothing but HTTP and JSON:

1. Lease: `POST /v1/queues/{queue}/lease {agent, max, wait_ms}` is a long poll; it answers
   `{tasks: [...]}`, each task with its entity, the action to carry out, the action's
   declared `targets`, a lease `token`, `locked_until` and `lock_ms`.
2. Work, and heartbeat while working when the lock is short:
   `POST /v1/tasks/{id}/heartbeat {token}` extends the lease by `lock_ms`; a 409 means the
   lease is lost (stop working on that task).
3. Report with the token: `POST /v1/tasks/{id}/complete {token, target, properties}` (the
   entity moves to `target`, one of the task's `targets`, with `properties` set), or
   `POST /v1/tasks/{id}/fail {token, error, retryable}` (a fault: retried by the machine's
   fault policy when retryable, parked for an operator otherwise). A report after the lock
   ran out, or on a task another lease reported, is refused (409) and changes nothing;
   the same report again with its token is a replay (202, "replayed": true).

What it reports: success with the task's first target and the properties that target
`requires` (the task lists them for each target); at `--fail-rate`, a retryable `fail`; at `--fatal-rate`, the
target `failed` when the action declares it, else a non-retryable `fail`.

Usage: python3 settle_agent.py --server http://127.0.0.1:7400 --queue provider
"""

import argparse
import http.client
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

# The server leases at most this many tasks per request.
MAX_LEASE = 100


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Problem(Exception):
    """The server answered with an error status (a problem+json body, usually)."""

    def __init__(self, status, body, retry_after=None):
        self.status = status
        self.body = body if isinstance(body, dict) else {}
        self.retry_after = retry_after
        detail = self.body.get("detail") or self.body.get("title") or str(body)[:200]
        super().__init__(f"{status}: {detail} ({self.kind})")

    @property
    def kind(self):
        """The problem type's last segment (`task-refused`, `unknown-queue`, ...)."""
        return str(self.body.get("type", "")).rsplit("/", 1)[-1] or "unknown"


class Unreachable(Exception):
    """The server could not be reached, or the connection broke."""


class Client:
    """The few routes an agent needs, over urllib."""

    def __init__(self, base, token=None):
        base = base.rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise ValueError(f"invalid server URL `{base}` (expected e.g. http://127.0.0.1:7400)")
        self.base = base
        self.token = token

    def call(self, method, path, body=None, timeout=30.0):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None or method != "GET":
            # Even without a body: the server refuses a POST that does not say JSON.
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                problem = json.loads(raw)
            except ValueError:
                problem = raw.decode(errors="replace")
            raise Problem(e.code, problem, e.headers.get("Retry-After")) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", e)
            raise Unreachable(f"cannot reach {self.base}: {reason}") from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise Unreachable(f"unexpected answer from {self.base}{path}: {raw[:200]!r}") from None

    def lease(self, queue, agent, max_tasks, wait_s):
        body = {"agent": agent, "max": max_tasks, "wait_ms": int(wait_s * 1000)}
        path = f"/v1/queues/{seg(queue)}/lease"
        return self.call("POST", path, body, timeout=wait_s + 30)["tasks"]

    def heartbeat(self, task):
        answer = self.call("POST", f"/v1/tasks/{task['id']}/heartbeat", {"token": task["token"]})
        return answer["locked_until"]

    def complete(self, task, target, properties):
        body = {"token": task["token"], "target": target, "properties": properties}
        self.call("POST", f"/v1/tasks/{task['id']}/complete", body)

    def fail(self, task, error, retryable):
        body = {"token": task["token"], "error": error, "retryable": retryable}
        self.call("POST", f"/v1/tasks/{task['id']}/fail", body)


def seg(s):
    """Percent-encodes a path segment (queue and machine names are user data)."""
    return urllib.parse.quote(s, safe="")


def provider_value(name, task, rng):
    """A plausible value for a property a provider would return."""
    key, machine = task["key"], task["machine"]
    host = "".join(c if c.isalnum() or c == "-" else "-" for c in f"{key}.{machine}".lower())
    n = name.lower()
    if n in ("ip", "ipv4", "address") or n.endswith("_ip"):
        return f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
    if "endpoint" in n:
        return f"{host}.example.internal:443"
    if n in ("host", "hostname", "fqdn", "dns", "record") or n.endswith("_host"):
        return f"{host}.example.internal"
    if "url" in n:
        return f"https://{host}.example.internal/"
    if "port" in n:
        return 443
    if n == "id" or n.endswith("_id"):
        return f"{machine}-{rng.getrandbits(32):08x}"
    return f"{n}-of-{key}"


def outputs(task, target, rng, latency_ms):
    """The properties to report with `target`: those it requires (the task says, for each
    target) and the entity lacks."""
    props = {"provider_call_ms": latency_ms}
    for name in task.get("requires", {}).get(target, []):
        if task["properties"].get(name) is None:
            props[name] = provider_value(name, task, rng)
    return props


class Agent:
    def __init__(self, args, client):
        self.args = args
        self.client = client
        self.stop = threading.Event()
        self.slots = threading.BoundedSemaphore(args.concurrency)
        self.busy_lock = threading.Lock()
        self.busy = 0
        self.idle = threading.Condition(self.busy_lock)
        self.last_work = time.monotonic()
        self.exit_code = 0

    # -- the lease loop -------------------------------------------------------------------

    def serve(self):
        """Leases tasks until stopped; each runs on its own thread, at most `concurrency`."""
        backoff = 0.5
        unreachable_since = None
        while not self.stop.is_set():
            # Lease only what there is room for: a leased task nobody works on would only
            # wait for its lock to run out.
            self.slots.acquire()
            free = 1
            while free < MAX_LEASE and self.slots.acquire(blocking=False):
                free += 1
            wait = self.args.poll_wait
            if self.args.once_idle_for is not None:
                wait = max(0.0, min(wait, self.idle_left()))
            try:
                tasks = []
                if not self.stop.is_set():
                    tasks = self.client.lease(self.args.queue, self.args.name, free, wait)
            except Unreachable as e:
                self.release(free)
                unreachable_since = unreachable_since or time.monotonic()
                down = time.monotonic() - unreachable_since
                since = f", for {down:.0f}s" if down >= 1 else ""
                log(f"server unreachable ({e}{since}), retrying in {backoff:.1f}s")
                if self.args.once_idle_for is None:
                    self.pause(backoff)
                else:
                    self.pause(min(backoff, max(self.idle_left(), 0.0)))
                backoff = min(backoff * 2, 10.0)
                self.check_idle()
                continue
            except Problem as e:
                self.release(free)
                if e.status == 429 or e.status >= 500:
                    delay = retry_after(e, backoff)
                    log(f"lease refused ({e}), retrying in {delay:.1f}s")
                    self.pause(delay)
                    backoff = min(backoff * 2, 10.0)
                    continue
                log(f"lease refused, stopping: {e}")
                self.exit_code = 2
                self.stop.set()
                break
            if unreachable_since is not None:
                log(f"server reachable again after {time.monotonic() - unreachable_since:.0f}s")
            unreachable_since, backoff = None, 0.5
            self.release(free - len(tasks))
            if tasks:
                self.touch()
            for task in tasks:
                with self.busy_lock:
                    self.busy += 1
                threading.Thread(target=self.run_task, args=(task,), daemon=True).start()
            self.check_idle()

    def release(self, n):
        for _ in range(n):
            self.slots.release()

    def pause(self, seconds):
        self.stop.wait(seconds)

    def touch(self):
        with self.busy_lock:
            self.last_work = time.monotonic()

    def idle_left(self):
        with self.busy_lock:
            if self.busy:
                return self.args.once_idle_for
            return self.args.once_idle_for - (time.monotonic() - self.last_work)

    def check_idle(self):
        if self.args.once_idle_for is not None and self.idle_left() <= 0:
            log(f"no task for {self.args.once_idle_for:g}s: stopping")
            self.stop.set()

    def run_task(self, task):
        try:
            self.work_on(task)
        except Exception as e:  # a bug must not kill the agent or leak its slot
            log(f"task {task.get('id')}: {type(e).__name__}: {e}")
        finally:
            self.slots.release()
            with self.busy_lock:
                self.busy -= 1
                self.last_work = time.monotonic()
                self.idle.notify_all()

    def wait_for_tasks(self):
        with self.busy_lock:
            while self.busy:
                self.idle.wait()

    # -- one task -------------------------------------------------------------------------

    def work_on(self, task):
        started = time.monotonic()
        what = f"task {task['id']} {task['machine']}/{task['key']} {task['action']} (attempt {task['attempt']})"
        # Deterministic per entity, state entry and attempt: a rerun with the same seed
        # draws alike, whatever order the tasks come in.
        parts = ("machine", "key", "state", "retry", "attempt", "errors")
        draw = "/".join([str(self.args.seed)] + [str(task[p]) for p in parts])
        rng = random.Random(draw)
        latency_ms = rng.randint(self.args.min_latency_ms, self.args.max_latency_ms)
        # The provider call, heartbeating meanwhile: a third of the lock between beats.
        beat_every = max(task["lock_ms"] / 3000.0, 0.05)
        deadline = started + latency_ms / 1000.0
        next_beat = started + beat_every
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            if now >= next_beat:
                try:
                    task["locked_until"] = self.client.heartbeat(task)
                except Problem as e:
                    log(f"{what}: lease lost, dropping it: {e}")
                    return
                except Unreachable as e:
                    # Keep working while the lease may still hold; beat again soon.
                    if time.time() * 1000 >= task["locked_until"]:
                        log(f"{what}: lease ran out while the server was unreachable, dropping it: {e}")
                        return
                    log(f"{what}: heartbeat failed, retrying: {e}")
                next_beat = now + beat_every
            time.sleep(max(0.0, min(deadline, next_beat) - now))

        x = rng.random()
        targets = task.get("targets") or []
        first = targets[0] if targets else ""
        # Undoing is never refused for good (as the Rust agent: deprovisioning can't fail).
        fatal_rate = 0.0 if first == "gone" else self.args.fatal_rate
        if x < fatal_rate:
            if "failed" in targets:
                outcome = "complete -> failed (provider refused the request)"
                report = lambda: self.client.complete(task, "failed", {"error": "provider refused the request"})
            else:
                outcome = "fail, not retryable (provider refused the request)"
                report = lambda: self.client.fail(task, "provider refused the request", False)
        elif x < fatal_rate + self.args.fail_rate:
            outcome = "fail, retryable (simulated transient failure)"
            report = lambda: self.client.fail(task, "provider unavailable (simulated transient failure)", True)
        else:
            props = outputs(task, first, rng, latency_ms)
            outcome = f"complete -> {first} {json.dumps(props, sort_keys=True)}"
            report = lambda: self.client.complete(task, first, props)
        took = f"{(time.monotonic() - started) * 1000:.0f}ms"
        try:
            self.report(task, report)
        except Problem as e:
            # Refused (the lease expired or the entity moved on): nothing changed; the
            # task is offered again if it still matters.
            log(f"{what}: {outcome} in {took}: report not taken: {e}")
            return
        except Unreachable as e:
            log(f"{what}: {outcome} in {took}: report lost, server unreachable: {e}")
            return
        log(f"{what}: {outcome} in {took}")

    def report(self, task, send):
        """Sends a report, retrying while the server is unreachable and the lease lasts (a
        repeat of a report that landed is refused with 409 and changes nothing)."""
        delay = 0.2
        while True:
            try:
                return send()
            except Unreachable:
                if time.time() * 1000 + delay * 1000 >= task["locked_until"]:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)


def retry_after(problem, default):
    try:
        return max(float(problem.retry_after), 0.1)
    except (TypeError, ValueError):
        return default


def parse_args(argv):
    p = argparse.ArgumentParser(description="A Settle agent: serves an agent queue with a simulated provider.")
    p.add_argument("--server", default=os.environ.get("SETTLE_SERVER", "http://127.0.0.1:7400"),
                   help="the server's URL (env SETTLE_SERVER; default %(default)s)")
    p.add_argument("--token", default=os.environ.get("SETTLE_TOKEN"),
                   help="bearer token, an agent token naming the queue (env SETTLE_TOKEN)")
    p.add_argument("--queue", default="provider", help="the queue to serve (default %(default)s)")
    p.add_argument("--name", default=None, help="this agent's name, recorded with the tasks it leases")
    p.add_argument("--concurrency", type=int, default=8, help="tasks worked on at once (default %(default)s)")
    p.add_argument("--fail-rate", type=float, default=0.0,
                   help="probability of a transient (retryable) failure, in [0, 1) (default %(default)s)")
    p.add_argument("--fatal-rate", type=float, default=0.0,
                   help="probability of a permanent failure, in [0, 1) (default %(default)s)")
    p.add_argument("--min-latency-ms", type=int, default=100, help="shortest provider call (default %(default)s)")
    p.add_argument("--max-latency-ms", type=int, default=800, help="longest provider call (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="seed of the simulation (default %(default)s)")
    p.add_argument("--poll-wait", type=float, default=10.0, metavar="SECONDS",
                   help="how long one lease request waits for a task (the server caps it); a stop "
                        "waits for the request under way (default %(default)s)")
    p.add_argument("--once-idle-for", type=float, default=None, metavar="SECONDS",
                   help="exit 0 once no task was leased or worked on for this long")
    args = p.parse_args(argv)
    if not (0.0 <= args.fail_rate < 1.0 and 0.0 <= args.fatal_rate < 1.0):
        p.error("--fail-rate and --fatal-rate must be in [0, 1)")
    if args.fail_rate + args.fatal_rate >= 1.0:
        p.error("--fail-rate plus --fatal-rate must be below 1")
    if args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    if not (0 <= args.min_latency_ms <= args.max_latency_ms):
        p.error("--max-latency-ms must be at least --min-latency-ms, both non-negative")
    if not 0 < args.poll_wait <= 3600:
        p.error("--poll-wait must be more than 0 and at most 3600 seconds")
    if args.once_idle_for is not None and args.once_idle_for <= 0:
        p.error("--once-idle-for must be positive")
    if args.name is None:
        args.name = f"python-agent-{socket.gethostname()}-{os.getpid()}"
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        client = Client(args.server, args.token)
    except ValueError as e:
        log(f"error: {e}")
        return 2
    agent = Agent(args, client)

    def on_signal(signum, _frame):
        if agent.stop.is_set():
            log("stopping now, without finishing")
            os._exit(1)
        log(f"{signal.Signals(signum).name}: stopping (finishing the tasks under way; again to quit now)")
        agent.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    log(f"agent {args.name} serving queue `{args.queue}` of {args.server}")
    leaser = threading.Thread(target=agent.serve, name="lease", daemon=True)
    leaser.start()
    # The main thread only waits, so that signals are handled at once.
    while leaser.is_alive():
        leaser.join(0.2)
    agent.wait_for_tasks()
    log(f"agent {args.name} stopped")
    return agent.exit_code


if __name__ == "__main__":
    sys.exit(main())
