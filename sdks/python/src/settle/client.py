"""The HTTP routes an agent (and a script driving a control plane) needs, over the standard
library's `http.client`, with one kept-alive connection per thread."""

from __future__ import annotations

import http.client
import ipaddress
import json
import threading
import urllib.parse
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

from .outcome import Fail, Outcome
from .task import Task

# The server leases at most this many tasks per request.
MAX_LEASE = 100


class Problem(Exception):
    """The server answered with an error status; `body` is its problem+json document. A
    redirect (3xx), which the client does not follow, is a `Problem` too (kind
    `redirect-not-followed`)."""

    def __init__(self, status: int, body: Any, retry_after: Optional[str] = None) -> None:
        self.status = status
        self.body: Dict[str, Any] = body if isinstance(body, dict) else {}
        self.retry_after = retry_after
        detail = self.body.get("detail") or self.body.get("title") or str(body)[:200]
        super().__init__(f"{status}: {detail} ({self.kind})")

    @property
    def kind(self) -> str:
        """The problem type's last segment (`task-refused`, `invalid-report`, ...)."""
        return str(self.body.get("type", "")).rsplit("/", 1)[-1] or "unknown"

    @property
    def field(self) -> Optional[str]:
        """The part of the request at fault, when the server names one (`create[1]`)."""
        value = self.body.get("field")
        return value if isinstance(value, str) else None


class Unreachable(Exception):
    """The server could not be reached, or the connection broke."""


class InsecureTransportWarning(UserWarning):
    """A [`Client`] with a token talks plain HTTP to a server that is not on a loopback
    address: the bearer token crosses the network in clear text. Silenced by
    `Client(..., insecure=True)`."""


def _is_loopback(host: str) -> bool:
    """Whether `host` (a URL's hostname) is `localhost` or a loopback address
    (127.0.0.0/8, ::1)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def segment(s: str) -> str:
    """Percent-encodes a path segment (machine names and keys are user data)."""
    return urllib.parse.quote(s, safe="")


class Client:
    """A Settle server's HTTP API. Thread-safe: each thread keeps its own connection alive.

    With a `token` and a plain `http://` URL whose host is not a loopback address
    (`localhost`, 127.0.0.0/8, `::1`), the token would cross the network in clear text: the
    client warns ([`InsecureTransportWarning`]) once, when made, unless `insecure=True` says
    this is meant (e.g. behind a TLS-terminating proxy on a trusted network). Redirects are
    not followed: a 3xx answer raises [`Problem`]."""

    def __init__(self, server: str, token: Optional[str] = None, timeout: float = 30.0, *,
                 insecure: bool = False) -> None:
        url = urllib.parse.urlsplit(server.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"invalid server URL `{server}` (expected e.g. http://127.0.0.1:7400)")
        # The server as messages name it, without any `user:password@`.
        self._where = f"{url.scheme}://{url.netloc.rpartition('@')[2]}{url.path}"
        if token and url.scheme == "http" and not insecure and not _is_loopback(url.hostname):
            warnings.warn(
                f"settle: the Client sends its bearer token to {self._where} over plain HTTP, not to a "
                "loopback address: the token crosses the network in clear text. Use an https:// URL, "
                "or pass insecure=True if this is meant",
                InsecureTransportWarning, stacklevel=2)
        self.server = server.rstrip("/")
        self._url = url
        self.token = token
        self.timeout = timeout
        self._local = threading.local()
        self._open: "list[http.client.HTTPConnection]" = []
        self._open_lock = threading.Lock()

    # -- transport ----------------------------------------------------------------------

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._url.scheme == "https" else http.client.HTTPConnection
            conn = cls(self._url.hostname, self._url.port, timeout=timeout)
            self._local.conn = conn
            with self._open_lock:
                self._open.append(conn)
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            with self._open_lock:
                self._open = [c for c in self._open if c is not conn]

    def close(self) -> None:
        """Closes every kept-alive connection (of every thread); the next call opens anew."""
        with self._open_lock:
            conns, self._open = self._open, []
        for conn in conns:
            conn.close()

    def call(self, method: str, path: str, body: Any = None, timeout: Optional[float] = None,
             idempotency_key: Optional[str] = None) -> Any:
        """One request; the decoded JSON answer (`None` when empty). Raises [`Problem`] on
        an error status and [`Unreachable`] when no answer came."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None or method != "GET":
            # Even without a body: the server refuses a POST that does not say JSON.
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        full = self._url.path + path
        # A kept-alive connection the server closed meanwhile fails at once: try a fresh one
        # once, for requests that change nothing or that the server recognises when repeated.
        for attempt in (1, 2):
            conn = self._connection(timeout or self.timeout)
            try:
                conn.request(method, full, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                status = resp.status
                reason = resp.reason
                retry_after = resp.getheader("Retry-After")
                location = resp.getheader("Location")
                if resp.getheader("Connection", "").lower() == "close":
                    self._drop()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self._drop()
                if attempt == 2:
                    raise Unreachable(f"cannot reach {self.server}: {e}") from None
            except (OSError, http.client.HTTPException) as e:
                self._drop()
                raise Unreachable(f"cannot reach {self.server}: {e}") from None
        if 300 <= status < 400:
            # Not followed: the answer is no JSON of the API, and following it would send
            # the token wherever `Location` points.
            raise Problem(status, _redirect(status, reason, location, self._where + path), retry_after)
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            if status >= 400:
                raise Problem(status, raw.decode(errors="replace"), retry_after) from None
            raise Unreachable(f"unexpected answer from {self.server}{path}: {raw[:200]!r}") from None
        if status >= 400:
            raise Problem(status, answer, retry_after)
        return answer

    # -- agents -------------------------------------------------------------------------

    def lease(self, queue: str, agent: str, max_tasks: int = 1, wait_s: float = 10.0) -> List[Task]:
        """Leases up to `max_tasks` (1 to 100) tasks of `queue`, waiting up to `wait_s` for
        the first (a long poll)."""
        body = {"agent": agent, "max": max(1, min(max_tasks, MAX_LEASE)), "wait_ms": int(wait_s * 1000)}
        answer = self.call("POST", f"/v1/queues/{segment(queue)}/lease", body, timeout=wait_s + 30)
        return [Task.from_json(t) for t in answer["tasks"]]

    def heartbeat(self, task: Task) -> int:
        """Extends the task's lease by its `lock_ms`: the new end (ms since the epoch).
        A 409 [`Problem`] means the lease is lost."""
        answer = self.call("POST", f"/v1/tasks/{task.id}/heartbeat", {"token": task.token})
        task.locked_until = int(answer["locked_until"])
        return task.locked_until

    def complete(self, task: Task, outcome: Outcome, next: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Reports the action's outcome: `{accepted, replayed}` (`replayed`: this very report
        landed before and changed nothing now). With `next` (`{"queue", "agent", "max"}`)
        the same request leases the next tasks once the report is accepted, without
        waiting: the answer's `tasks` holds them as [`Task`]s (possibly none)."""
        body = outcome.body(task.token)
        if next is not None:
            body["next"] = next
        return self._leased(self.call("POST", f"/v1/tasks/{task.id}/complete", body))

    def fail(self, task: Task, error: str, retryable: bool = True,
             next: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Reports a failure: a fault of the entity, decided by its fault policy. `next` as
        for [`complete`]."""
        body: Dict[str, Any] = {"token": task.token, "error": error, "retryable": retryable}
        if next is not None:
            body["next"] = next
        return self._leased(self.call("POST", f"/v1/tasks/{task.id}/fail", body))

    def report_many(self, reports: "List[Tuple[Task, Union[Outcome, Fail]]]",
                    next: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Sends many reports in one request: each `(task, Outcome)` a `complete`, each
        `(task, Fail)` a `fail`. Each is applied or refused on its own: the answer's
        `results` say, in order, `{task, accepted, replayed, problem?}` (a refusal's
        `problem` as its own request would have answered, its `field` prefixed with
        `reports[i].`); with `next`, `tasks` holds the next tasks leased."""
        body: Dict[str, Any] = {"reports": []}
        for task, result in reports:
            if isinstance(result, Fail):
                one = {"token": task.token, "error": result.error, "retryable": result.retryable}
                body["reports"].append({"task": task.id, "fail": one})
            else:
                body["reports"].append({"task": task.id, "complete": result.body(task.token)})
        if next is not None:
            body["next"] = next
        return self._leased(self.call("POST", "/v1/tasks/reports", body))

    @staticmethod
    def _leased(answer: Dict[str, Any]) -> Dict[str, Any]:
        if answer.get("tasks") is not None:
            answer["tasks"] = [Task.from_json(t) for t in answer["tasks"]]
        return answer

    # -- entities -----------------------------------------------------------------------

    def create(self, machine: str, key: str, properties: Optional[Dict[str, Any]] = None,
               request_id: Optional[str] = None) -> Dict[str, Any]:
        """Creates an entity (201); with `request_id` (sent as `Idempotency-Key`, the
        operation's request id) a repeat is recognised and answered the same."""
        path = f"/v1/machines/{segment(machine)}/entities"
        return self._with_request_id("POST", path, {"key": key, "properties": properties or {}}, request_id)

    def raise_event(self, machine: str, key: str, event: str, params: Optional[Dict[str, Any]] = None,
                    request_id: Optional[str] = None, wait: Optional[str] = None,
                    timeout: Optional[str] = None, priority: Optional[int] = None) -> Dict[str, Any]:
        """Raises `event` on an entity: queued (202) unless `wait` is `accepted`, `stable` or
        `operation` (then bounded by `timeout`, e.g. `"30s"`). `priority` (-1000 to 1000;
        default: the event's declared one) orders the work it starts in a limit's line,
        higher first."""
        path = f"/v1/machines/{segment(machine)}/entities/{segment(key)}/events/{segment(event)}"
        query = {k: v for k, v in (("wait", wait), ("timeout", timeout)) if v}
        if priority is not None:
            query["priority"] = str(int(priority))
        if query:
            path += "?" + urllib.parse.urlencode(query)
        return self._with_request_id("POST", path, params or {}, request_id, read_timeout=_seconds(timeout) + 30)

    def get(self, machine: str, key: str) -> Optional[Dict[str, Any]]:
        """The entity, or `None` when there is none. A deleted entity is answered too, with
        its final state (the server's 410)."""
        try:
            return self.call("GET", f"/v1/machines/{segment(machine)}/entities/{segment(key)}")
        except Problem as e:
            if e.status == 404:
                return None
            if e.status == 410:
                return {"machine": machine, "key": key, "state": e.body.get("state"), "deleted": True}
            raise

    def related(self, machine: str, key: str) -> Dict[str, Any]:
        """An entity's predecessors, successors and subscriptions."""
        return self.call("GET", f"/v1/machines/{segment(machine)}/entities/{segment(key)}/related")

    def _with_request_id(self, method: str, path: str, body: Any, request_id: Optional[str],
                         read_timeout: Optional[float] = None) -> Any:
        return self.call(method, path, body, timeout=read_timeout, idempotency_key=request_id)


def _redirect(status: int, reason: str, location: Optional[str], url: str) -> Dict[str, Any]:
    """The problem document for a redirect answer, which the client does not follow."""
    answered = f"{status} {reason or ''}".strip()
    to = f" to {location[:300]!r}" if location else " (no Location)"
    detail = (f"the server answered a redirect ({answered}){to} for {url}, which this client does not "
              "follow: the request and its token were not sent on; point the Client at the final URL")
    return {"type": "redirect-not-followed", "title": "redirect not followed", "status": status,
            "detail": detail, "location": location}


def _seconds(duration: Optional[str]) -> float:
    """Seconds of a duration such as `30s`, `2m` or `1h` (0 when absent or unreadable)."""
    if not duration:
        return 0.0
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for suffix in ("ms", "s", "m", "h"):
        if duration.endswith(suffix):
            try:
                return float(duration[: -len(suffix)]) * units[suffix]
            except ValueError:
                return 0.0
    return 0.0
