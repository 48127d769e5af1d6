"""The package against a real `settle serve` (the binary in `$SETTLE`): a report with the
action's whole outcome, heartbeats that keep a slow task's lease, `Fail`, a report beyond
the action's declaration refused, and a graceful stop. Skipped, saying so, without `$SETTLE`,
unless `SETTLE_REQUIRE_SDK` is set (as `.ci/run` does)."""

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
from pathlib import Path

from settle import Agent, Client, Fail, Outcome, Problem, Task, Unreachable

HERE = Path(__file__).resolve().parent
SETTLE = os.environ.get("SETTLE")
if not SETTLE and os.environ.get("SETTLE_REQUIRE_SDK"):
    raise RuntimeError("SETTLE_REQUIRE_SDK is set but SETTLE names no settle binary")


@unittest.skipUnless(SETTLE, "skipped: set SETTLE to a settle binary to test against a real server")
class LiveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory(prefix="settle-sdk-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cls.log = open(Path(cls.dir.name) / "serve.log", "w")
        cls.serve = subprocess.Popen(
            [SETTLE, "serve", "--machines", str(HERE / "machines"), "--db", str(Path(cls.dir.name) / "t.db"),
             "--listen", f"127.0.0.1:{port}"],
            stdout=cls.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        cls.client = Client(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while True:
            try:
                cls.client.call("GET", "/healthz", timeout=2)
                break
            except (Unreachable, Problem):
                if cls.serve.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((Path(cls.dir.name) / "serve.log").read_text())
                time.sleep(0.1)
        cls.agent = Agent(cls.client, queue="sdk", name="sdk-test", concurrency=4, poll_wait_s=1.0)
        cls.seen = []

        @cls.agent.action("job", "work")
        def work(task: Task) -> Outcome:
            cls.seen.append(task)
            mode = task.properties.get("mode")
            if mode == "create":
                child = f"{task.key}-child"
                return Outcome.to("done").set(result=1).create("job", child).raise_("poke", machine="job", key=child)
            if mode == "slow":
                time.sleep(2.5)  # longer than the 1s lock: only heartbeats keep the lease
                return Outcome.to("done").set(slept=True)
            if mode == "ask":
                # A sync nested event: the child's `run_sized` workflow answers `child_done`.
                child = f"{task.key}-child"
                return Outcome.to("waiting").create("job", child, event="run_sized", params={"size": 1},
                                                    reply="child_done")
            if mode == "fail":
                raise Fail("the provider said no", retryable=False)
            if mode == "beyond" and task.attempt == 1:
                return Outcome.to("done").raise_("run", machine="job", key="elsewhere")
            return Outcome.to("broken")

        cls.runner = threading.Thread(target=cls.agent.run, kwargs={"handle_signals": False}, daemon=True)
        cls.runner.start()

    @classmethod
    def tearDownClass(cls):
        cls.agent.stop()
        cls.runner.join(30)
        cls.client.close()
        cls.serve.send_signal(signal.SIGTERM)
        cls.serve.wait(30)
        cls.log.close()
        cls.dir.cleanup()

    def start(self, key, mode, params=None):
        self.client.create("job", key, {"mode": mode})
        self.client.raise_event("job", key, "run_sized" if params else "run", params)

    def wait_for(self, key, check, limit=30.0):
        return self.wait_for_in("job", key, check, limit)

    def test_a_raise_sends_its_priority_and_one_out_of_range_is_refused(self):
        self.client.create("job", "prio-1")
        with self.assertRaises(Problem) as refused:
            self.client.raise_event("job", "prio-1", "run", priority=5000)
        self.assertEqual((refused.exception.status, refused.exception.body.get("field")), (400, "priority"))
        accepted = self.client.raise_event("job", "prio-1", "run", priority=-3)
        self.assertIn("request_id", accepted)
        self.wait_for("prio-1", lambda e: e["state"] == "broken")

    def test_one_report_moves_creates_a_successor_and_raises_on_it(self):
        self.start("c-1", "create", {"size": 3})
        e = self.wait_for("c-1", lambda e: e["state"] == "done")
        # The task names the event whose workflow entered its state, with its parameters.
        [task] = [t for t in self.seen if t.key == "c-1"]
        targets = ["done", "broken", "working", "waiting"]
        self.assertEqual((task.event, task.params, task.targets), ("run_sized", {"size": 3}, targets))
        self.assertEqual(e["properties"]["result"], 1)
        child = self.wait_for("c-1-child", lambda e: e["properties"].get("poked") is True)
        self.assertEqual(child["state"], "idle")
        related = self.client.related("job", "c-1")
        self.assertEqual([(s["machine"], s["key"]) for s in related["successors"]], [("job", "c-1-child")])

    def test_a_reply_comes_back_when_the_created_entitys_workflow_ends(self):
        self.start("r-1", "ask")
        e = self.wait_for("r-1", lambda e: e["state"] == "done")
        # The child (no mode) ended its `run_sized` workflow in `broken`: the reply says so.
        self.assertEqual((e["properties"]["child_outcome"], e["properties"]["child_state"]), ("accepted", "broken"))

    def test_a_report_leases_the_next_task_in_the_same_request(self):
        for key in ("n-1", "n-2"):
            self.client.create("batch", key)
            self.client.raise_event("batch", key, "run")
        deadline = time.monotonic() + 30
        first = []
        while not first:
            self.assertLess(time.monotonic(), deadline, "no task of `sdk-next` was offered")
            first = self.client.lease("sdk-next", "by-hand", 1, wait_s=1.0)
        # A bad `next` is refused before the report is applied: nothing changed.
        with self.assertRaises(Problem) as refused:
            self.client.complete(first[0], Outcome.to("done"), next={"queue": "nowhere", "agent": "by-hand"})
        self.assertEqual(refused.exception.field, "next.queue")
        self.assertEqual(self.client.get("batch", first[0].key)["state"], "working")
        nxt = {"queue": "sdk-next", "agent": "by-hand", "max": 1}
        answer = self.client.complete(first[0], Outcome.to("done"), next=nxt)
        [second] = answer["tasks"]
        self.assertEqual({first[0].key, second.key}, {"n-1", "n-2"})
        self.assertEqual(self.client.complete(second, Outcome.to("done"), next=nxt)["tasks"], [])
        for key in ("n-1", "n-2"):
            self.wait_for_in("batch", key, lambda e: e["state"] == "done")

    def test_many_reports_in_one_request_each_applied_or_refused(self):
        for key in ("m-1", "m-2", "m-3"):
            self.client.create("batch", key)
            self.client.raise_event("batch", key, "run")
        deadline = time.monotonic() + 30
        leased = []
        while len(leased) < 2:
            self.assertLess(time.monotonic(), deadline, f"only {leased} of `sdk-next` were offered")
            leased += self.client.lease("sdk-next", "by-hand", 2 - len(leased), wait_s=1.0)
        done, parked = leased
        stale = Task.from_json({**done.raw, "token": "not-its-token"})
        nxt = {"queue": "sdk-next", "agent": "by-hand", "max": 5}
        answer = self.client.report_many(
            [(done, Outcome.to("done")), (parked, Fail("quota", retryable=False)), (stale, Outcome.to("done"))], next=nxt)
        fate = [(r["task"], r["accepted"], (r.get("problem") or {}).get("field")) for r in answer["results"]]
        self.assertEqual(fate, [(done.id, True, None), (parked.id, True, None), (done.id, False, "reports[2].complete")])
        [third] = answer["tasks"]
        self.assertNotIn(third.key, (done.key, parked.key))
        self.client.complete(third, Outcome.to("done"))
        self.wait_for_in("batch", done.key, lambda e: e["state"] == "done")
        self.wait_for_in("batch", third.key, lambda e: e["state"] == "done")
        self.wait_for_in("batch", parked.key, lambda e: e["run_status"] == "failed")

    def wait_for_in(self, machine, key, check, limit=30.0):
        deadline = time.monotonic() + limit
        while True:
            e = self.client.get(machine, key)
            if e is not None and check(e):
                return e
            self.assertLess(time.monotonic(), deadline, f"{machine} {key}: {e}")
            time.sleep(0.05)

    def test_heartbeats_keep_the_lease_of_a_task_longer_than_its_lock(self):
        self.start("s-1", "slow")
        e = self.wait_for("s-1", lambda e: e["state"] == "done")
        self.assertTrue(e["properties"]["slept"])
        tasks = [t for t in self.seen if t.key == "s-1"]
        self.assertEqual(len(tasks), 1, "the task was never offered again: its lease held")
        self.assertEqual((tasks[0].event, tasks[0].params), ("run", None), "an event raised without parameters")

    def test_fail_not_retryable_parks_the_entity(self):
        self.start("f-1", "fail")
        e = self.wait_for("f-1", lambda e: e["run_status"] == "failed")
        self.assertEqual(e["state"], "working")

    def test_a_report_beyond_the_declaration_is_refused_and_changes_nothing(self):
        refused = self.agent.counts["refused"]
        self.start("b-1", "beyond")
        # Refused (raise[0]: `run` is not in may_raise); the lease runs out and the task
        # comes again (attempt 2), whose report is taken.
        e = self.wait_for("b-1", lambda e: e["state"] == "broken")
        self.assertGreater(self.agent.counts["refused"], refused)
        self.assertEqual([t.attempt for t in self.seen if t.key == "b-1"], [1, 2])
        self.assertIsNone(self.client.get("job", "elsewhere"))


class StopTest(unittest.TestCase):
    def test_a_stopped_agent_with_nothing_to_do_returns(self):
        agent = Agent(Client("http://127.0.0.1:9"), queue="q", poll_wait_s=0.2)
        agent.stop()
        t = threading.Thread(target=agent.run, kwargs={"handle_signals": False})
        t.start()
        t.join(5)
        self.assertFalse(t.is_alive())


if __name__ == "__main__":
    unittest.main()
