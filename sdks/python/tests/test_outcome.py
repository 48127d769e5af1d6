"""The outcome builder and the task: pure, no server."""

import unittest

from settle import Fail, Outcome, OutcomeError, Task


class OutcomeTest(unittest.TestCase):
    def test_a_target_with_properties_is_what_most_reports_are(self):
        body = Outcome.to("ready").set(endpoint="e:443", n=3).unset("draft").body("tok")
        self.assertEqual(body, {"token": "tok", "target": "ready", "properties": {"endpoint": "e:443", "n": 3, "draft": None}})

    def test_a_failure_says_why(self):
        body = Outcome.to("failed").failed_because("provider refused the request").body("t")
        self.assertEqual(body, {"token": "t", "target": "failed", "error": "provider refused the request"})
        with self.assertRaises(OutcomeError):
            Outcome.to("failed").failed_because("")

    def test_a_retry_names_no_target_and_may_wait(self):
        self.assertEqual(Outcome.retry().body("t"), {"token": "t"})
        self.assertEqual(Outcome.retry(delay_ms=250).body("t"), {"token": "t", "delay_ms": 250})
        self.assertEqual(Outcome.to("x").after(0).body("t"), {"token": "t", "target": "x", "delay_ms": 0})

    def test_creates_and_raises_keep_their_order_and_fields(self):
        out = (Outcome.to("busy")
               .create("app", "s-app", {"next": "db"}, event="start", params={"n": 1})
               .create("dns", "s-dns")
               .raise_("start", machine="db", key="s-db", params={"x": True}, join=True)
               .raise_("delete", on="successors")
               .raise_("recheck", on="self", params={"depth": 2}))
        body = out.body("t")
        self.assertEqual(body["create"], [
            {"machine": "app", "key": "s-app", "properties": {"next": "db"}, "event": "start", "params": {"n": 1}},
            {"machine": "dns", "key": "s-dns"},
        ])
        self.assertEqual(body["raise"], [
            {"event": "start", "machine": "db", "key": "s-db", "join": True, "params": {"x": True}},
            {"event": "delete", "on": "successors"},
            {"event": "recheck", "on": "self", "params": {"depth": 2}},
        ])
        self.assertEqual(repr(out), "Outcome(to busy, create app/s-app, create dns/s-dns, "
                                    "raise start on db/s-db, raise delete on successors, raise recheck on self)")

    def test_a_raise_or_a_created_entitys_first_event_may_ask_for_a_reply(self):
        body = (Outcome.to("waiting")
                .create("app", "s-app", event="start", reply="app_done")
                .raise_("provision", machine="db", key="s-db", reply="db_done")).body("t")
        self.assertEqual(body["create"], [{"machine": "app", "key": "s-app", "event": "start", "reply": "app_done"}])
        self.assertEqual(body["raise"], [{"event": "provision", "machine": "db", "key": "s-db", "reply": "db_done"}])

    def test_mistakes_are_refused_where_they_are_made_naming_the_part(self):
        cases = [
            (lambda: Outcome.to(""), "target"),
            (lambda: Outcome.to("x").after(-1), "delay_ms"),
            (lambda: Outcome.to("x").after(True), "delay_ms"),
            (lambda: Outcome.to("x").create("app", ""), "create[0]: key"),
            (lambda: Outcome.to("x").create("app", "k").create("app", "a\nb"), "create[1]: key: contains a control"),
            (lambda: Outcome.to("x").create("app", "k" * 257), "create[0]: key: at most 256"),
            (lambda: Outcome.to("x").create("app", "k", params={}), "create[0]: params without an event"),
            (lambda: Outcome.to("x").raise_("e"), "raise[0]: name the entity"),
            (lambda: Outcome.to("x").raise_("e", machine="m", key="k", on="successors"), "not both"),
            (lambda: Outcome.to("x").raise_("e", on="children"), "raise[0]: on: expected one of"),
            (lambda: Outcome.to("x").raise_("e", on="successors", join=True), "join needs"),
            (lambda: Outcome.to("x").raise_("e", on="successors", reply="r"), "a reply comes from"),
            (lambda: Outcome.to("x").create("app", "k", reply="r"), "create[0]: a reply without an event"),
            (lambda: Outcome.to("x").set({"": 1}), "property name"),
        ]
        for make, message in cases:
            with self.subTest(message=message):
                with self.assertRaises(OutcomeError) as caught:
                    make()
                self.assertIn(message, str(caught.exception))

    def test_fail_is_retryable_unless_said(self):
        self.assertTrue(Fail("x").retryable)
        self.assertFalse(Fail("x", retryable=False).retryable)


class TaskTest(unittest.TestCase):
    def test_a_task_reads_the_lease_answer_and_keeps_what_it_does_not_know(self):
        raw = {
            "id": 7, "queue": "q", "machine": "job", "key": "j-1", "state": "working", "action": "work",
            "targets": ["done", "broken"], "requires": {"done": ["result"]}, "may_create": ["job"],
            "may_raise": ["poke"], "attempt": 2, "retry": 1, "errors": 0, "properties": {"mode": "ok"},
            "request_id": "r-1", "token": "tok", "locked_until": 10_000, "lock_ms": 1000, "novel": 1,
        }
        t = Task.from_json(raw)
        self.assertEqual((t.id, t.machine, t.key, t.targets, t.requires), (7, "job", "j-1", ["done", "broken"], {"done": ["result"]}))
        self.assertEqual((t.attempt, t.retry, t.request_id, t.may_create, t.may_raise), (2, 1, "r-1", ["job"], ["poke"]))
        self.assertEqual(t.raw["novel"], 1)
        self.assertEqual(t.idempotency_key, "job/j-1/working/1")
        self.assertFalse(t.lease_lost)


if __name__ == "__main__":
    unittest.main()
