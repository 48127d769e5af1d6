"""The agents of the reference control plane (`machines/*.toml`), written with the `settle`
Python package (`sdks/python`): every action that is not declarative in the TOML is one
function here, and a report carries the action's whole outcome (entities to create,
events to raise), committed with the entity's transition.

- queue `control`: the logical server's own work (`create_resources`, `finish`);
- queue `provider`: the resources' provider calls (`provision`, `deprovision`), against a
  simulated provider: each call takes `min_ms`..`max_ms`, fails transiently at
  `transient_rate` (the action runs again after a backoff) and, for a provisioning, fails
  for good at `fail_rate` (the resource ends `failed`, which undoes its server). It counts
  the calls running at once per region (a resource's `region` property) and notes every
  time it sees more than `region_limit`.

The draws are deterministic per entity, state entry and attempt, so a run with the same
seed decides alike whatever order the tasks come in.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from settle import Agent, Client, Outcome, Task

# The resources a server creates, and the one each starts once it is ready: app, then
# database, then alias; dns beside them.
RESOURCES = ("app", "database", "alias", "dns")
NEXT = {"app": "database", "database": "alias"}
STARTED_AT_ONCE = ("app", "dns")


@dataclass
class Provider:
    """The simulated provider's behaviour."""

    fail_rate: float = 0.0
    transient_rate: float = 0.1
    min_ms: int = 5
    max_ms: int = 50
    seed: int = 1
    # At most this many calls at once per region, as the machines' limit promises (`None`:
    # no promise to check).
    region_limit: Optional[int] = None
    running: Dict[str, int] = field(default_factory=dict)
    most: Dict[str, int] = field(default_factory=dict)
    over: List[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, task: Task, can_fail: bool) -> str:
        """One provider call for `task`: `ok`, `transient` or `fatal`."""
        draw = random.Random(f"{self.seed}/{task.machine}/{task.key}/{task.state}/{task.retry}/{task.attempt}")
        region = str(task.properties.get("region", ""))
        with self.lock:
            now = self.running.get(region, 0) + 1
            self.running[region] = now
            self.most[region] = max(self.most.get(region, 0), now)
            if self.region_limit is not None and now > self.region_limit:
                self.over.append(f"{now} calls at once in region {region!r} ({task.machine} {task.key}), "
                                 f"over the limit of {self.region_limit}")
        try:
            time.sleep(draw.randint(self.min_ms, max(self.min_ms, self.max_ms)) / 1000.0)
        finally:
            with self.lock:
                self.running[region] -= 1
        x = draw.random()
        if can_fail and x < self.fail_rate:
            return "fatal"
        if x < self.fail_rate + self.transient_rate:
            return "transient"
        return "ok"


def backoff_ms(task: Task) -> int:
    """How long a transient failure waits before the action runs again."""
    return min(50 * 2 ** min(task.retry, 5), 1000)


def control_agent(client: Client, name: str = "control") -> Agent:
    """The agent of queue `control`: the logical server's actions."""
    agent = Agent(client, queue="control", name=name, concurrency=8)

    @agent.action("server", "create_resources")
    def create_resources(task: Task) -> Outcome:
        # The four resources in one commit with the server's transition: each becomes its
        # successor (the subscriptions watch them); app and dns start at once, database and
        # alias wait for the resource before them.
        out = Outcome.to("creating_resources")
        for kind in RESOURCES:
            props = {"server": task.key, "region": task.properties.get("region", "")}
            if kind in NEXT:
                props["next"] = NEXT[kind]
            out.create(kind, f"{task.key}-{kind}", props, event="start" if kind in STARTED_AT_ONCE else None)
        return out

    @agent.action("server", "finish")
    def finish(task: Task) -> Outcome:
        return Outcome.to("ready").set(endpoint=f"{task.key}.servers.example")

    return agent


def provider_agent(client: Client, provider: Provider, name: str = "provider", concurrency: int = 32) -> Agent:
    """The agent of queue `provider`: every resource's provider calls."""
    agent = Agent(client, queue="provider", name=name, concurrency=concurrency)

    def provision(task: Task) -> Outcome:
        result = provider.call(task, can_fail=True)
        if result == "fatal":
            return Outcome.to("failed").failed_because("provider refused the request")
        if result == "transient":
            return Outcome.retry(delay_ms=backoff_ms(task))
        out = Outcome.to("ready").set(record=f"{task.key}.{task.machine}.example", error=None)
        following = task.properties.get("next")
        if following:
            out.raise_("start", machine=following, key=f"{task.properties['server']}-{following}")
        return out

    def deprovision(task: Task) -> Outcome:
        if provider.call(task, can_fail=False) == "transient":
            return Outcome.retry(delay_ms=backoff_ms(task))
        return Outcome.to("gone")

    for kind in RESOURCES:
        agent.register(kind, "provision", provision)
        agent.register(kind, "deprovision", deprovision)
    return agent


def all_agents(client: Client, provider: Provider) -> List[Agent]:
    """The agents that serve the control plane: one per queue."""
    return [control_agent(client), provider_agent(client, provider)]
