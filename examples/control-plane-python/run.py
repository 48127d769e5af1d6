#!/usr/bin/env python3
"""Runs the reference control plane without Rust: `settle serve` with the TOML machines of
`machines/`, the Python agents of `agents.py`, N logical servers created over HTTP, and a
check that every one of them came to rest as the scenario says.

    python3 examples/control-plane-python/run.py --servers 200 --fail-rate 0.2 --db /tmp/cp.db --delete-half

The `settle` binary is `$SETTLE`, else `target/release/settle` of this repository. It prints
progress on standard error and one JSON line on standard output: the counts of entities by
machine and state, what was checked, and how long it took. It exits 1 when a check fails
(what failed is in the line's `problems` and on standard error), 2 on bad arguments or
when the server cannot start.

What is checked, once every server is at rest: each server is `ready` with its four
resources `ready`, or `failed` with every resource it created deleted (`gone`); with
`--delete-half`, every second server is deleted, and so is each of its resources; each live
server lists its four resources as successors (`/related`); no entity is left mid-workflow
(in a state with an auto action, or with queued events or a fault).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
try:
    import settle  # noqa: F401  (installed with `pip install ./sdks/python`)
except ImportError:  # run from the repository without installing it
    sys.path.insert(0, str(REPO / "sdks" / "python" / "src"))
sys.path.insert(0, str(HERE))

from agents import RESOURCES, Provider, all_agents  # noqa: E402
from settle import Client, Problem, Unreachable  # noqa: E402

MACHINES = ("server",) + RESOURCES
# The regions servers are spread over (round robin), each resource in its server's.
REGIONS = ("eu", "us", "ap")
# States an entity may rest in, by machine: anything else is mid-workflow.
AT_REST = {"server": {"ready", "failed", "gone"}, **{kind: {"waiting", "ready", "gone"} for kind in RESOURCES}}


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="The reference control plane: TOML machines and Python agents.")
    p.add_argument("--servers", type=int, default=50, help="logical servers to create (default %(default)s)")
    p.add_argument("--fail-rate", type=float, default=0.0,
                   help="probability that a resource's provisioning fails for good, in [0, 1) (default %(default)s)")
    p.add_argument("--transient-rate", type=float, default=0.1,
                   help="probability that a provider call fails and is retried, in [0, 1) (default %(default)s)")
    p.add_argument("--db", required=True, help="the SQLite file (created when missing; must hold no servers of a run before)")
    p.add_argument("--delete-half", action="store_true", help="then delete every second server, and wait for it")
    p.add_argument("--seed", type=int, default=1, help="seed of the simulated provider (default %(default)s)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the servers at most (default %(default)s)")
    p.add_argument("--settle", default=os.environ.get("SETTLE", str(REPO / "target" / "release" / "settle")),
                   help="the settle binary (env SETTLE; default target/release/settle)")
    p.add_argument("--region-limit", type=int, default=None,
                   help="at most N provider calls at once per region: the resources' machines declare it as a "
                        "concurrency limit, and the run fails if the provider ever sees more (default: no limit)")
    p.add_argument("--verbose", action="store_true", help="log every task the agents run")
    args = p.parse_args(argv)
    if args.region_limit is not None and args.region_limit < 1:
        p.error("--region-limit must be at least 1")
    if args.servers < 1:
        p.error("--servers must be at least 1")
    if not (0.0 <= args.fail_rate < 1.0 and 0.0 <= args.transient_rate < 1.0) or args.fail_rate + args.transient_rate >= 1.0:
        p.error("--fail-rate and --transient-rate must be in [0, 1), and below 1 together")
    if not Path(args.settle).is_file():
        p.error(f"no settle binary at {args.settle} (build it with `cargo build --release -p settle-cli`, or set SETTLE)")
    return args


class Serve:
    """`settle serve` on a free local port, its log in a temporary file; stopped with SIGTERM."""

    def __init__(self, binary: str, db: str, machines: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile(prefix="settle-serve-", suffix=".log", delete=False)
        cmd = [binary, "serve", "--machines", str(machines), "--db", db, "--listen", f"127.0.0.1:{port}"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_ready(self, client: Client, limit: float = 60.0) -> None:
        deadline = time.monotonic() + limit
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"settle serve exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                client.call("GET", "/healthz", timeout=2)
                return
            except (Unreachable, Problem):
                if time.monotonic() > deadline:
                    raise SystemExit(f"settle serve did not answer within {limit:.0f}s:\n{self.tail()}")
                time.sleep(0.1)

    def tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.unlink(self.log.name)


def limited_machines(limit: int, into: Path) -> Path:
    """The machines of `machines/`, each resource's provider calls (`provisioning`,
    `deleting`) limited to `limit` at once per region: one limit the four machines share."""
    into.mkdir(parents=True, exist_ok=True)
    for path in (HERE / "machines").glob("*.toml"):
        text = path.read_text()
        if path.stem in RESOURCES:
            # `properties` is a top-level key: before the first table.
            head, _, rest = text.partition("\n[")
            text = (f'{head}\nproperties = ["region"]\n\n[{rest}'
                    f'\n[limits.provider_calls]\nstates = ["provisioning", "deleting"]\nmax = {limit}\n'
                    f'key = "props.region"\n')
        (into / path.name).write_text(text)
    return into


def entities(client: Client, machine: str) -> List[Dict]:
    """Every entity of `machine`, deleted ones included."""
    items, after = [], None
    while True:
        path = f"/v1/entities?machine={machine}&limit=1000" + (f"&after={after}" if after else "")
        page = client.call("GET", path)
        items.extend(page["items"])
        after = page.get("next")
        if not after:
            return items


def settled(e: Dict) -> bool:
    """Whether an entity is at rest: a resting state, nothing queued, running normally."""
    return (e["state"] in AT_REST[e["machine"]] and not e.get("inbox")
            and e.get("run_status", "active") in ("active",) and not e.get("busy"))


def wait_for_rest(client: Client, keys: List[str], want: set, deadline: float, what: str) -> None:
    """Polls until every server of `keys` is in one of `want` and every entity is at rest."""
    started, last = time.monotonic(), None
    while True:
        servers = {e["key"]: e for e in entities(client, "server")}
        done = sum(1 for k in keys if servers.get(k, {}).get("state") in want and settled(servers[k]))
        busy = [e for m in RESOURCES for e in entities(client, m) if not settled(e)] if done == len(keys) else []
        if done == len(keys) and not busy:
            say(f"{what}: all {len(keys)} at rest after {time.monotonic() - started:.1f}s")
            return
        if last is None or time.monotonic() - last >= 2:
            last = time.monotonic()
            say(f"{what}: {done} of {len(keys)} servers at rest ({time.monotonic() - started:.0f}s)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {done} of {len(keys)} servers at rest when the time ran out")
        time.sleep(0.25)


def check(client: Client, keys: List[str], deleted: set) -> List[str]:
    """What the scenario promises, checked against the store: the problems found."""
    problems = []
    by_machine = {m: {e["key"]: e for e in entities(client, m)} for m in MACHINES}
    for key in keys:
        server = by_machine["server"].get(key)
        if server is None:
            problems.append(f"server {key}: missing")
            continue
        resources = {kind: by_machine[kind].get(f"{key}-{kind}") for kind in RESOURCES}
        states = {kind: (r or {}).get("state") for kind, r in resources.items()}
        want = {"gone"} if key in deleted else {"ready", "failed"}
        if server["state"] not in want:
            problems.append(f"server {key}: {server['state']}, expected one of {sorted(want)}")
        if server["state"] == "ready" and any(s != "ready" for s in states.values()):
            problems.append(f"server {key}: ready, but its resources are {states}")
        if server["state"] in ("failed", "gone") and any(s != "gone" for s in states.values()):
            problems.append(f"server {key}: {server['state']}, but its resources are {states} (not all deleted)")
        if server["state"] != "gone":
            related = client.related("server", key)
            successors = sorted(f"{s['machine']}/{s['key']}" for s in related["successors"])
            expected = sorted(f"{kind}/{key}-{kind}" for kind in RESOURCES)
            if successors != expected:
                problems.append(f"server {key}: successors {successors}, expected {expected}")
    for machine, items in by_machine.items():
        for e in items.values():
            if not settled(e):
                problems.append(f"{machine} {e['key']}: mid-workflow ({e['state']}, run status "
                                f"{e.get('run_status')}, {len(e.get('inbox') or [])} queued)")
    return problems


def counts(client: Client) -> Dict[str, Dict[str, int]]:
    out: Dict[str, Dict[str, int]] = {}
    for m in MACHINES:
        for e in entities(client, m):
            out.setdefault(m, {}).setdefault(e["state"], 0)
            out[m][e["state"]] += 1
    return {m: dict(sorted(c.items())) for m, c in out.items()}


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(threadName)s %(message)s")
    started = time.monotonic()
    scratch = tempfile.TemporaryDirectory(prefix="settle-cp-")
    machines = HERE / "machines"
    if args.region_limit is not None:
        machines = limited_machines(args.region_limit, Path(scratch.name) / "machines")
    serve = Serve(args.settle, args.db, machines)
    client = Client(serve.url)
    agents = []
    try:
        serve.wait_ready(client)
        say(f"settle serve at {serve.url}, database {args.db}")
        provider = Provider(fail_rate=args.fail_rate, transient_rate=args.transient_rate, seed=args.seed,
                            region_limit=args.region_limit)
        agents = all_agents(client, provider)
        threads = [threading.Thread(target=a.run, kwargs={"handle_signals": False}, daemon=True) for a in agents]
        for t in threads:
            t.start()

        keys = [f"srv-{i:04d}" for i in range(args.servers)]
        if any(e["key"] in keys for e in entities(client, "server")):
            say(f"error: {args.db} already holds servers of an earlier run: give a new --db")
            return 2

        def create(key: str) -> None:
            # The request ids make both calls safe to repeat after a lost answer.
            region = REGIONS[int(key.rsplit("-", 1)[1]) % len(REGIONS)]
            client.create("server", key, {"region": region}, request_id=f"create-{key}")
            client.raise_event("server", key, "create", request_id=f"create-event-{key}")

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(create, keys))
        say(f"created {len(keys)} servers")
        deadline = time.monotonic() + args.timeout
        wait_for_rest(client, keys, {"ready", "failed"}, deadline, "create")

        deleted = set()
        if args.delete_half:
            deleted = set(keys[::2])

            def delete(key: str) -> None:
                client.raise_event("server", key, "delete", request_id=f"delete-{key}")

            with ThreadPoolExecutor(16) as pool:
                list(pool.map(delete, sorted(deleted)))
            say(f"deleting {len(deleted)} servers")
            wait_for_rest(client, sorted(deleted), {"gone"}, deadline, "delete")

        problems = check(client, keys, deleted) + provider.over[:5]
        result = {
            "servers": args.servers,
            "fail_rate": args.fail_rate,
            "deleted": len(deleted),
            "counts": counts(client),
            "agents": {a.queue: a.counts for a in agents},
            "seconds": round(time.monotonic() - started, 1),
            "region_limit": args.region_limit,
            "most_calls_at_once": dict(sorted(provider.most.items())),
            "ok": not problems,
            "problems": problems[:20],
        }
        print(json.dumps(result, sort_keys=True), flush=True)
        for p in problems:
            say(f"problem: {p}")
        return 0 if not problems else 1
    except TimeoutError as e:
        say(f"error: {e}")
        print(json.dumps({"servers": args.servers, "ok": False, "problems": [str(e)], "counts": counts(client)}))
        return 1
    finally:
        for a in agents:
            a.stop()
        serve.stop()
        scratch.cleanup()


if __name__ == "__main__":
    sys.exit(main())
