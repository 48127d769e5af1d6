"""A leased task: what an action needs to run, as the server sends it (DESIGN §5)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class Task:
    """One leased task of an agent queue: the entity, the action to carry out, what the
    action may do (`targets`, `requires`, `may_create`, `may_raise`) and the lease."""

    id: int
    queue: str
    machine: str
    key: str
    state: str
    action: str
    targets: List[str]
    properties: Dict[str, Any]
    # Not in `repr`: a handler that logs its task must not log the lease token.
    token: str = field(repr=False)
    locked_until: int
    lock_ms: int
    attempt: int = 1
    retry: int = 0
    errors: int = 0
    request_id: Optional[str] = None
    requires: Dict[str, List[str]] = field(default_factory=dict)
    may_create: List[str] = field(default_factory=list)
    may_raise: List[str] = field(default_factory=list)
    event: Optional[str] = None
    params: Any = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    lost: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    @classmethod
    def from_json(cls, t: Dict[str, Any]) -> "Task":
        """A task from the lease answer; fields this version does not know stay in `raw`."""
        return cls(
            id=int(t["id"]),
            queue=t["queue"],
            machine=t["machine"],
            key=t["key"],
            state=t["state"],
            action=t["action"],
            targets=list(t.get("targets") or []),
            properties=dict(t.get("properties") or {}),
            token=t["token"],
            locked_until=int(t["locked_until"]),
            lock_ms=int(t["lock_ms"]),
            attempt=int(t.get("attempt", 1)),
            retry=int(t.get("retry", 0)),
            errors=int(t.get("errors", 0)),
            request_id=t.get("request_id"),
            requires={k: list(v) for k, v in (t.get("requires") or {}).items()},
            may_create=list(t.get("may_create") or []),
            may_raise=list(t.get("may_raise") or []),
            event=t.get("event"),
            params=t.get("params"),
            raw=dict(t),
        )

    @property
    def idempotency_key(self) -> str:
        """Stable for the entity's state entry and attempt: give it to a provider so that a
        call repeated after a crash is recognised."""
        return f"{self.machine}/{self.key}/{self.state}/{self.retry}"

    @property
    def lease_lost(self) -> bool:
        """Whether the lease is known to be lost (a heartbeat was refused): the report will
        be refused, so long work may stop early."""
        return self.lost.is_set()

    def lease_left_ms(self) -> int:
        """How long the lease lasts from now, as far as this agent knows."""
        return self.locked_until - int(time.time() * 1000)
