"""What the package does to keep a token where it belongs: a warning for a token sent over
plain HTTP beyond loopback, no lease token in a task's `repr`, and a redirect refused as a
`Problem` (not followed). No settle server: a tiny local HTTP server answers redirects."""

import dataclasses
import http.server
import threading
import unittest
import warnings

from settle import Client, InsecureTransportWarning, Problem, Task


def made_warnings(*args, **kwargs):
    """The `InsecureTransportWarning`s that making `Client(*args, **kwargs)` gives."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Client(*args, **kwargs)
    return [w for w in caught if issubclass(w.category, InsecureTransportWarning)]


class InsecureTransportTest(unittest.TestCase):
    def test_a_token_over_plain_http_beyond_loopback_is_warned_about(self):
        for server in ("http://192.0.2.10:7400", "http://settle.example.com", "http://[2001:db8::1]:7400",
                       "http://10.0.0.7:7400/base"):
            with self.subTest(server=server):
                [w] = made_warnings(server, token="s3cret-token")
                self.assertTrue(issubclass(w.category, UserWarning))
                message = str(w.message)
                self.assertIn("plain HTTP", message)
                self.assertIn("insecure=True", message)
                self.assertNotIn("s3cret-token", message, "the warning must not show the token")
                self.assertEqual(w.filename, __file__, "the warning points at the caller's line")

    def test_the_warning_does_not_repeat_credentials_of_the_url(self):
        [w] = made_warnings("http://user:pw-8c1e@192.0.2.10:7400", token="t")
        self.assertNotIn("pw-8c1e", str(w.message))
        self.assertIn("http://192.0.2.10:7400", str(w.message))

    def test_insecure_true_says_it_is_meant(self):
        self.assertEqual(made_warnings("http://192.0.2.10:7400", token="t", insecure=True), [])

    def test_https_loopback_or_no_token_never_warn(self):
        cases = [
            ("https://192.0.2.10:7400", "t"),
            ("https://settle.example.com", "t"),
            ("http://127.0.0.1:7400", "t"),
            ("http://127.8.9.10:7400", "t"),
            ("http://localhost:7400", "t"),
            ("http://LOCALHOST:7400", "t"),
            ("http://[::1]:7400", "t"),
            ("http://192.0.2.10:7400", None),
            ("http://192.0.2.10:7400", ""),
        ]
        for server, token in cases:
            with self.subTest(server=server, token=token):
                self.assertEqual(made_warnings(server, token=token), [])

    def test_a_client_warns_once_when_made_not_at_each_call(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            client = Client("http://192.0.2.10:7400", token="t", timeout=0.01)
            self.assertEqual(len(caught), 1)
            self.assertEqual(client.token, "t", "the token is kept: a warning, not a refusal")


class TaskReprTest(unittest.TestCase):
    def task(self, token):
        return Task(id=7, queue="q", machine="job", key="j-1", state="working", action="work",
                    targets=["done"], properties={"mode": "ok"}, token=token, locked_until=10_000, lock_ms=1000)

    def test_the_lease_token_is_not_in_a_tasks_repr(self):
        t = self.task("lease-tok-9f3a")
        for shown in (repr(t), str(t), f"{t}", repr([t])):
            self.assertNotIn("lease-tok-9f3a", shown)
            self.assertNotIn("token", shown)
        self.assertIn("job", repr(t))
        self.assertIn("j-1", repr(t))

    def test_nor_in_the_repr_of_a_task_read_from_a_lease_answer(self):
        raw = {"id": 7, "queue": "q", "machine": "job", "key": "j-1", "state": "working", "action": "work",
               "token": "lease-tok-9f3a", "locked_until": 10_000, "lock_ms": 1000}
        self.assertNotIn("lease-tok-9f3a", repr(Task.from_json(raw)))

    def test_the_token_stays_a_plain_attribute(self):
        t = self.task("tok")
        self.assertEqual(t.token, "tok")
        [token] = [f for f in dataclasses.fields(Task) if f.name == "token"]
        self.assertEqual((token.repr, token.compare, token.init), (False, True, True))
        self.assertNotEqual(t, self.task("other"), "the token still counts in equality")
        t.token = "new"
        self.assertEqual(t.token, "new")


class Redirecting(http.server.BaseHTTPRequestHandler):
    """Answers every request with a 307 to `location` (a class attribute), with a body
    that is no JSON; or, with `location` None, a 301 without `Location` or body."""

    location = None
    seen = None  # a list of (method, path, headers) the server was sent

    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.seen.append((self.command, self.path, dict(self.headers)))
        if self.location is None:
            self.send_response(301)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"<html><body>moved</body></html>"
        self.send_response(307)
        self.send_header("Location", self.location)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer

    def log_message(self, *args):
        pass


class Recording(http.server.BaseHTTPRequestHandler):
    """Records whatever comes (it should not); answers `{}`."""

    seen = None

    def answer(self):
        self.seen.append((self.command, self.path, dict(self.headers)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = answer

    def log_message(self, *args):
        pass


def serve(handler):
    """A server on a free loopback port in a daemon thread; its `http://` URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class RedirectTest(unittest.TestCase):
    def setUp(self):
        # Where the redirects point: it must never be asked anything.
        self.elsewhere_seen = []
        self.elsewhere, elsewhere_url = serve(type("Elsewhere", (Recording,), {"seen": self.elsewhere_seen}))
        self.target = elsewhere_url + "/v1/moved"
        self.seen = []
        self.redirecting, self.url = serve(type("Redirects", (Redirecting,), {"seen": self.seen, "location": self.target}))
        self.client = Client(self.url, token="tok-not-to-be-forwarded", timeout=5)

    def tearDown(self):
        self.client.close()
        for server in (self.redirecting, self.elsewhere):
            server.shutdown()
            server.server_close()

    def assert_redirect_problem(self, caught, status=307):
        e = caught.exception
        self.assertEqual(e.status, status)
        self.assertEqual(e.kind, "redirect-not-followed")
        self.assertIn("redirect", str(e))
        self.assertIn("not follow", str(e))
        self.assertIn("token were not sent on", str(e))
        self.assertNotIn("tok-not-to-be-forwarded", str(e))
        self.assertEqual(self.elsewhere_seen, [], "the redirect was followed")

    def test_a_lease_answered_with_a_redirect_is_a_problem_not_a_type_error(self):
        with self.assertRaises(Problem) as caught:
            self.client.lease("q", "a", 1, wait_s=0.1)
        self.assert_redirect_problem(caught)
        self.assertIn(self.target, str(caught.exception), "the detail names where it pointed")
        self.assertEqual(caught.exception.body["location"], self.target)
        [(method, path, headers)] = self.seen
        self.assertEqual((method, path), ("POST", "/v1/queues/q/lease"))
        self.assertEqual(headers.get("Authorization"), "Bearer tok-not-to-be-forwarded")

    def test_a_plain_call_answered_with_a_redirect_is_a_problem(self):
        with self.assertRaises(Problem) as caught:
            self.client.call("GET", "/healthz")
        self.assert_redirect_problem(caught)
        self.assertIn("/healthz", str(caught.exception))
        # `get` answers None only for a 404: a redirect is no missing entity.
        with self.assertRaises(Problem) as caught:
            self.client.get("job", "j-1")
        self.assert_redirect_problem(caught)

    def test_a_redirect_without_location_or_body_is_a_problem_too(self):
        self.redirecting.RequestHandlerClass.location = None
        with self.assertRaises(Problem) as caught:
            self.client.lease("q", "a", 1, wait_s=0.1)
        self.assert_redirect_problem(caught, status=301)
        self.assertIn("no Location", str(caught.exception))

    def test_the_client_works_on_after_a_redirect(self):
        for _ in range(3):
            with self.assertRaises(Problem):
                self.client.call("POST", "/v1/tasks/1/heartbeat", {"token": "t"})
        self.assertEqual(len(self.seen), 3)

    def test_the_recording_server_does_answer_so_the_checks_above_mean_something(self):
        client = Client(self.target.rsplit("/v1", 1)[0])
        try:
            self.assertEqual(client.call("GET", "/v1/moved"), {})
        finally:
            client.close()
        self.assertEqual(len(self.elsewhere_seen), 1)
        self.elsewhere_seen.clear()


if __name__ == "__main__":
    unittest.main()
