"""What an action did: the outcome an agent reports (DESIGN §5), built with the same verbs as
a Rust handler's `Outcome` (`to`, `set`, `create`, `raise_`, `retry`)."""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional

# A key as the server accepts it: 1 to MAX_KEY characters, no control characters (checked
# again by the server; caught here so that the mistake points at the line that made it).
MAX_KEY = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_RELATIONS = ("predecessors", "successors", "self")


class OutcomeError(ValueError):
    """An outcome that the server would refuse, caught while it is built."""


class Outcome:
    """The whole outcome of an action, reported with `complete`.

    ```python
    Outcome.to("ready").set(endpoint="10.0.0.7:443")
    Outcome.to("creating_resources").create("app", "srv-1-app", event="start")
    Outcome.retry(delay_ms=2000)                      # the same state again, later
    Outcome.to("ready").raise_("start", machine="database", key="srv-1-database")
    Outcome.to("undoing").raise_("delete", on="successors")
    ```

    Everything in it commits in one transaction with the entity's transition, or not at
    all: a created entity becomes the reporter's successor, a raised event is written to
    its entity's inbox. What the action may create and raise is declared in its machine
    (`may_create`, `may_raise`; the task lists them); anything beyond is refused.
    """

    def __init__(self, target: Optional[str] = None) -> None:
        self.target = target
        self.delay_ms: Optional[int] = None
        self.properties: Dict[str, Any] = {}
        self.creates: List[Dict[str, Any]] = []
        self.raises: List[Dict[str, Any]] = []
        self.error: Optional[str] = None

    @classmethod
    def to(cls, state: str) -> "Outcome":
        """Move to `state`, one of the action's declared targets."""
        if not isinstance(state, str) or not state:
            raise OutcomeError(f"target: expected a state name, not {state!r}")
        return cls(state)

    @classmethod
    def retry(cls, delay_ms: Optional[int] = None) -> "Outcome":
        """Stay in the state and run the action again, after `delay_ms` (else the state's
        declared wait). Counts as a retry of the state entry, not as an error."""
        return cls(None).after(delay_ms) if delay_ms is not None else cls(None)

    def after(self, delay_ms: int) -> "Outcome":
        """Wait `delay_ms` before the entered state's auto action runs (overrides its wait)."""
        if not isinstance(delay_ms, int) or isinstance(delay_ms, bool) or delay_ms < 0:
            raise OutcomeError(f"delay_ms: expected a non-negative integer, not {delay_ms!r}")
        self.delay_ms = delay_ms
        return self

    def failed_because(self, message: str) -> "Outcome":
        """Say why the action failed: with a target declared `health = "error"`, the
        message is recorded in the entity's errors (kind `failure`) and shown by
        `settle why` and the dashboard as the cause of the failure."""
        if not isinstance(message, str) or not message:
            raise OutcomeError(f"error: expected a non-empty message, not {message!r}")
        self.error = message
        return self

    def set(self, properties: Optional[Dict[str, Any]] = None, **more: Any) -> "Outcome":
        """Set properties on the entity (a value of `None` removes the property)."""
        for name, value in {**(properties or {}), **more}.items():
            if not isinstance(name, str) or not name:
                raise OutcomeError(f"properties: a property name must be a non-empty string, not {name!r}")
            self.properties[name] = value
        return self

    def unset(self, *names: str) -> "Outcome":
        """Remove properties from the entity."""
        return self.set({n: None for n in names})

    def create(
        self,
        machine: str,
        key: str,
        properties: Optional[Dict[str, Any]] = None,
        event: Optional[str] = None,
        params: Optional[Dict[str, Any]] = None,
        reply: Optional[str] = None,
    ) -> "Outcome":
        """Create an entity of `machine` named `key`, with constructor `properties`, and
        raise `event` (with `params`) on it in the same commit. It becomes this entity's
        successor: this entity's subscriptions see its states. With `reply` (an event of
        this entity's machine), `event` is a sync nested event: when its workflow ends on
        the new entity, the engine raises `reply` on this one with what came of it."""
        field = f"create[{len(self.creates)}]"
        _check_name(field, "machine", machine)
        _check_key(field, key)
        if params is not None and event is None:
            raise OutcomeError(f"{field}: params without an event")
        if reply is not None and event is None:
            raise OutcomeError(f"{field}: a reply without an event to answer")
        item: Dict[str, Any] = {"machine": machine, "key": key}
        if properties:
            item["properties"] = dict(properties)
        if event is not None:
            _check_name(field, "event", event)
            item["event"] = event
        if params is not None:
            item["params"] = params
        if reply is not None:
            _check_name(field, "reply", reply)
            item["reply"] = reply
        self.creates.append(item)
        return self

    def raise_(
        self,
        event: str,
        machine: Optional[str] = None,
        key: Optional[str] = None,
        on: Optional[str] = None,
        params: Optional[Dict[str, Any]] = None,
        join: bool = False,
        reply: Optional[str] = None,
    ) -> "Outcome":
        """Raise `event` on the entity named by `machine` and `key`, or on every entity
        related to this one `on` that way (`"predecessors"` or `"successors"`), or with
        `on="self"` on this entity itself: an internal event, processed right after this
        report commits, before anything else queued for it. With
        `join=True` the named entity joins this entity's workflow (becomes a successor).
        With `reply` (an event of this entity's machine) it is a sync nested event that
        holds nothing open: when the event's workflow ends on that entity (rejected,
        ignored, failed, or the entity at rest again) the engine raises `reply` on this
        entity with `machine`, `key`, `event`, `outcome`, `state` and `reason` (those the
        reply event declares); meanwhile this entity waits in the state it moved to."""
        field = f"raise[{len(self.raises)}]"
        _check_name(field, "event", event)
        item: Dict[str, Any] = {"event": event}
        if on is not None:
            if machine is not None or key is not None:
                raise OutcomeError(f"{field}: name the entity by `machine` and `key`, or by `on`, not both")
            if on not in _RELATIONS:
                raise OutcomeError(f"{field}: on: expected one of {', '.join(_RELATIONS)}, not {on!r}")
            if join:
                raise OutcomeError(f"{field}: join needs an entity named by `machine` and `key`")
            if reply is not None:
                raise OutcomeError(f"{field}: a reply comes from an entity named by `machine` and `key`")
            item["on"] = on
        else:
            if machine is None or key is None:
                raise OutcomeError(f"{field}: name the entity by `machine` and `key`, or by `on`")
            _check_name(field, "machine", machine)
            _check_key(field, key)
            item["machine"] = machine
            item["key"] = key
            if join:
                item["join"] = True
            if reply is not None:
                _check_name(field, "reply", reply)
                item["reply"] = reply
        if params is not None:
            item["params"] = params
        self.raises.append(item)
        return self

    def body(self, token: str) -> Dict[str, Any]:
        """The `complete` request's body."""
        body: Dict[str, Any] = {"token": token}
        if self.target is not None:
            body["target"] = self.target
        if self.delay_ms is not None:
            body["delay_ms"] = self.delay_ms
        if self.error is not None:
            body["error"] = self.error
        if self.properties:
            body["properties"] = dict(self.properties)
        if self.creates:
            body["create"] = [dict(c) for c in self.creates]
        if self.raises:
            body["raise"] = [dict(r) for r in self.raises]
        return body

    def describe(self) -> str:
        """One line for a log: the target (or `retry`), the properties set as JSON, what is
        unset, created and raised: `ready {"endpoint": "…"} create app/web-1-app`."""
        parts = [self.target or "retry"]
        if self.delay_ms is not None:
            parts.append(f"after {self.delay_ms}ms")
        if self.properties:
            parts.append(json.dumps(self.properties, sort_keys=True, default=str))
        for c in self.creates:
            parts.append(f"create {c['machine']}/{c['key']}")
        for r in self.raises:
            where = r.get("on") or f"{r['machine']}/{r['key']}"
            parts.append(f"raise {r['event']} on {where}")
        return " ".join(parts)

    def __repr__(self) -> str:
        parts = [f"to {self.target}" if self.target else "retry"]
        if self.delay_ms is not None:
            parts.append(f"after {self.delay_ms} ms")
        if self.properties:
            parts.append(f"set {sorted(self.properties)}")
        for c in self.creates:
            parts.append(f"create {c['machine']}/{c['key']}")
        for r in self.raises:
            where = r.get("on") or f"{r['machine']}/{r['key']}"
            parts.append(f"raise {r['event']} on {where}")
        return f"Outcome({', '.join(parts)})"


class Fail(Exception):
    """Raised by an action to report `fail`: a fault of the entity, decided by its fault
    policy. `retryable=False` parks the entity for an operator at once."""

    def __init__(self, error: str, retryable: bool = True) -> None:
        super().__init__(error)
        self.error = error
        self.retryable = retryable


def _check_name(field: str, what: str, name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise OutcomeError(f"{field}: {what}: expected a name, not {name!r}")


def _check_key(field: str, key: Any) -> None:
    if not isinstance(key, str) or not key:
        raise OutcomeError(f"{field}: key: expected a non-empty string, not {key!r}")
    if len(key) > MAX_KEY:
        raise OutcomeError(f"{field}: key: at most {MAX_KEY} characters (this one has {len(key)})")
    if _CONTROL.search(key):
        raise OutcomeError(f"{field}: key: contains a control character: {key!r}")
