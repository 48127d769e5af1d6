#!/usr/bin/env python3
"""A Settle agent serving a queue with a simulated provider, built on the Python package
(`sdks/python`, import `settle`; DESIGN §5).

It does what `settle agent` (crates/cli/src/agent.rs) does, for any machine and action of
the queue: a provider call that takes a while (heartbeats keep the lease meanwhile, the
package sends them), then a report. What it reports: the task's first target with the
properties that target `requires` and the entity lacks (the task lists them for each
target); at `--fail-rate`, a retryable `fail`; at `--fatal-rate`, the target `failed` when
the action declares it, else a non-retryable `fail` (never when undoing: first target
`gone`). Draws depend only on the seed, the entity, its state entry and the attempt, so a
rerun fails alike.

The package does the protocol: leases (a long poll), heartbeats, reports retried while the
server is away, a graceful stop on SIGTERM/SIGINT. Run from the repository, it uses
`sdks/python/src` when the package is not installed (`pip install ./sdks/python`).

Usage: python3 settle_agent.py --server http://127.0.0.1:7400 --queue provider
"""

import argparse
import logging
import os
import random
import socket
import sys
import time
from pathlib import Path

try:
    import settle  # noqa: F401  (installed with `pip install ./sdks/python`)
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "sdks" / "python" / "src"))

from settle import Agent, Client, Fail, Outcome, Task  # noqa: E402


def provider_value(name: str, task: Task, rng: random.Random):
    """A plausible value for a property a provider would return."""
    host = "".join(c if c.isalnum() or c == "-" else "-" for c in f"{task.key}.{task.machine}".lower())
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
        return f"{task.machine}-{rng.getrandbits(32):08x}"
    return f"{n}-of-{task.key}"


class Provider:
    """The simulated provider: one function for every machine and action of the queue."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def __call__(self, task: Task) -> Outcome:
        # Deterministic per entity, state entry and attempt, whatever order tasks come in.
        parts = (task.machine, task.key, task.state, task.retry, task.attempt, task.errors)
        rng = random.Random("/".join(str(p) for p in (self.args.seed, *parts)))
        latency_ms = rng.randint(self.args.min_latency_ms, self.args.max_latency_ms)
        # The provider call. A lease lost meanwhile (a heartbeat refused) ends it early:
        # its report would be refused.
        deadline = time.monotonic() + latency_ms / 1000.0
        while not task.lease_lost and time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

        x = rng.random()
        first = task.targets[0] if task.targets else ""
        # Undoing is never refused for good (as the Rust agent: deprovisioning can't fail).
        fatal_rate = 0.0 if first == "gone" else self.args.fatal_rate
        if x < fatal_rate:
            if "failed" in task.targets:
                return Outcome.to("failed").failed_because("provider refused the request")
            raise Fail("provider refused the request", retryable=False)
        if x < fatal_rate + self.args.fail_rate:
            raise Fail("provider unavailable (simulated transient failure)", retryable=True)
        outcome = Outcome.to(first).set(provider_call_ms=latency_ms)
        for name in task.requires.get(first, []):
            if task.properties.get(name) is None:
                outcome.set({name: provider_value(name, task, rng)})
        return outcome


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


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        client = Client(args.server, args.token)
    except ValueError as e:
        logging.error("error: %s", e)
        return 2
    agent = Agent(client, args.queue, name=args.name, concurrency=args.concurrency, poll_wait_s=args.poll_wait)
    agent.register("*", "*", Provider(args))
    agent.run(once_idle_for=args.once_idle_for)
    return 2 if agent.refusal is not None else 0


if __name__ == "__main__":
    sys.exit(main())
