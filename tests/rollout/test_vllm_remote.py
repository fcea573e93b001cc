"""A rollout server started elsewhere (`ragen rollout serve`, run as another host runs it: tests/vllm_env.py's
OtherHost), against the client a run connects with: a server that does not know the run's
token, serves another precision or too small a LoRA rank is refused in one line saying what to change; one that was
restarted after the run pushed its weights refuses the run's next request instead of sampling with its start weights;
and the pool routes part k of each turn to server k mod (servers), each part one request with its own cache salt,
the answers back in prompt order."""

from __future__ import annotations

import pytest

from ragen_core.rollout.vllm_backend import ServerPool
from ragen_core.rollout.vllm_client import BackendUnavailable, RemoteServer, VLLMServerError
from tests.vllm_env import TOKEN, OtherHost, free_port


def _connect(host: OtherHost, token: str = TOKEN, **settings) -> RemoteServer:
    settings = {"dtype": "float32", **settings}
    return RemoteServer.connect(host.url, token, f"the vLLM server at {host.url}", **settings)


@pytest.mark.vllm
@pytest.mark.process
@pytest.mark.parametrize(
    ("token", "settings", "said"),
    [
        ("another-token-0123456789", {}, "does not know this run's RAGEN_ROLLOUT_TOKEN"),
        (TOKEN, {"dtype": "bfloat16"}, "serves float32, the run trains in bfloat16: start it with --dtype bfloat16"),
        (TOKEN, {"lora_rank": 8}, "it serves adapters up to rank 0: start it with --max-lora-rank 8"),
    ],
)
def test_a_server_that_cannot_serve_the_run_is_refused_saying_what_to_change(other_host, token, settings, said):
    with pytest.raises(BackendUnavailable) as caught:
        _connect(other_host, token, **settings)
    message = str(caught.value)
    assert message.startswith(f"the vLLM server at {other_host.url}") and said in message and "\n" not in message
    assert TOKEN not in message and "another-token" not in message  # no token in an error


@pytest.mark.vllm
@pytest.mark.process
def test_no_server_at_the_url_is_one_line(tiny_model_dir):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BackendUnavailable) as caught:
        RemoteServer.connect(url, TOKEN, f"the vLLM server at {url}", dtype="float32")
    assert str(caught.value).startswith(f"the vLLM server at {url} did not answer on /health (")


@pytest.mark.vllm
@pytest.mark.process
def test_a_restarted_server_refuses_the_runs_next_request(other_host, tiny_model_dir, tiny_policy):
    model, _ = tiny_policy
    server = _connect(other_host)
    server.load_weights(tiny_model_dir, reference=model)  # the run's push: a tag of its own
    sampling = [{"temperature": 1.0, "max_tokens": 4, "seed": 1, "stop_token_ids": []}]
    assert len(server.generate([[1, 2, 3]], sampling)[0]["token_ids"]) == 4
    other_host.stop()
    other_host.start()  # its host starts it again: on its start weights
    with pytest.raises(VLLMServerError) as caught:
        server.generate([[1, 2, 3]], sampling)
    assert str(caught.value) == (
        f"the vLLM server at {other_host.url} answered 409 to /generate: this server holds other weights than the "
        "client pushed last (it was restarted, or another run pushed its own): `ragen resume` pushes the run's "
        "weights again"
    )


class Recorder:
    """Stands for a server in the pool's routing: records each request and answers with the prompt's first id; with
    ``fail``, fails every request as a dead server does (``lost``) or as one refusing the request does; ``wait``:
    an event each request waits for first."""

    def __init__(self, fail: bool = False, lost: bool = True, wait=None) -> None:
        self.requests, self.fail, self.lost, self.wait, self.closed = [], fail, lost, wait, False

    def generate(self, prompts, sampling, adapter=None, salt=None):
        self.requests.append(([p[0] for p in prompts], [s["seed"] for s in sampling], adapter, salt))
        if self.wait is not None:
            self.wait.wait(10)
        if self.fail:
            reason = "did not answer on /generate (refused)" if self.lost else "answered 500 to /generate: too long"
            raise VLLMServerError(f"the vLLM server 2 of 2 at http://127.0.0.1:9 {reason}", lost=self.lost)
        return [{"token_ids": [p[0]], "logprobs": [0.0]} for p in prompts]

    def close(self):
        self.closed = True


GROUPS = [0, 0, 1, 1, 2, 2, 3, 4]  # group g in part g mod 3: part 0 holds prompts 0, 1, 6; part 1 2, 3, 7; part 2 4, 5


def _turn(pool):
    prompts = [[100 + i] for i in range(len(GROUPS))]
    sampling = [{"seed": 10 + i} for i in range(len(GROUPS))]
    outputs = pool.generate(prompts, sampling, 7, GROUPS)
    assert [o["token_ids"][0] for o in outputs] == [100 + i for i in range(len(GROUPS))]  # in prompt order


def test_part_k_of_a_turn_goes_to_server_k_mod_servers_with_its_own_salt():
    a, b = Recorder(), Recorder()
    _turn(ServerPool([a, b], shards=3))
    assert a.requests == [([100, 101, 106], [10, 11, 16], 7, "shard-0"), ([104, 105], [14, 15], 7, "shard-2")]
    assert b.requests == [([102, 103, 107], [12, 13, 17], 7, "shard-1")]  # seeds stay with their prompts


def test_one_part_is_the_whole_turn_in_one_request_without_a_salt():
    one = Recorder()
    _turn(ServerPool([one]))
    assert one.requests == [(list(range(100, 108)), list(range(10, 18)), 7, None)]


def test_a_lost_server_stops_the_turn_unless_the_run_continues_without_it(capsys):
    a, b = Recorder(), Recorder(fail=True)
    with pytest.raises(VLLMServerError, match="did not answer on /generate"):
        _turn(ServerPool([a, b], shards=3))
    a, b = Recorder(), Recorder(fail=True)
    pool = ServerPool([a, b], shards=3, on_loss="continue")
    _turn(pool)  # every prompt answered, in order
    assert pool.servers == [a] and b.closed
    # b failed part 1; a, now the only server, serves it (parts 0 and 2 it had served already are not sent again)
    assert [request[3] for request in a.requests] == ["shard-0", "shard-2", "shard-1"]
    warning = capsys.readouterr().err.strip().splitlines()
    assert warning == [
        "warning: the vLLM server 2 of 2 at http://127.0.0.1:9 did not answer on /generate (refused); continuing on "
        "the other 1 server(s) (rollout.vllm.on_server_loss=continue: this run's rows may differ from a run that "
        "kept it)"
    ]
    alone = ServerPool([Recorder(fail=True)], on_loss="continue")
    with pytest.raises(VLLMServerError):  # no other server to continue on
        _turn(alone)


def test_a_refused_request_is_no_lost_server_even_when_the_run_continues():
    a, b = Recorder(), Recorder(fail=True, lost=False)
    pool = ServerPool([a, b], shards=3, on_loss="continue")
    with pytest.raises(VLLMServerError, match="answered 500"):
        _turn(pool)
    assert pool.servers == [a, b] and not b.closed  # no healthy server dropped for a request it refused


def test_two_lanes_that_see_one_server_fail_drop_it_once():
    """An async run's two lanes (evaluation and sampling) share the pool; both meet the dead server at once."""
    import threading

    release = threading.Event()
    a, b = Recorder(), Recorder(fail=True, wait=release)
    pool = ServerPool([a, b], shards=2, on_loss="continue")
    failures = []

    def lane():
        try:
            _turn(pool)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    lanes = [threading.Thread(target=lane) for _ in range(2)]
    for thread in lanes:
        thread.start()
    while len(b.requests) < 2:  # both lanes wait inside the dead server's request
        threading.Event().wait(0.01)
    release.set()
    for thread in lanes:
        thread.join(10)
    assert failures == [] and pool.servers == [a] and b.closed


class _Answer:
    """A one-route HTTP server on loopback standing for what may answer at a listed URL: records each request's
    headers, answers ``status`` with ``body`` (and ``location``)."""

    def __init__(self, status: int, body: bytes, location: str | None = None) -> None:
        import http.server
        import threading

        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self):
                seen.append((self.command, self.path, dict(self.headers)))
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _any

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_token_goes_with_no_health_question_and_follows_no_redirect():
    elsewhere = _Answer(200, b'{"outputs": []}')
    redirecting = _Answer(302, b"", location=f"{elsewhere.url}/generate")
    healthy = _Answer(200, b'{"state": "ready", "token_digest": "x"}')
    try:
        client = RemoteServer(redirecting.url, TOKEN, "the vLLM server at X")
        with pytest.raises(VLLMServerError) as caught:
            client.generate([[1]], [{"seed": 1}])
        assert "answered 302 to /generate" in str(caught.value) and TOKEN not in str(caught.value)
        assert elsewhere.seen == []  # the redirect was not followed: the token never reached another server
        with pytest.raises(BackendUnavailable, match="does not know this run's RAGEN_ROLLOUT_TOKEN"):
            RemoteServer(healthy.url, TOKEN, "the vLLM server at Y").known_health()
        assert [headers.get("Authorization") for _, _, headers in healthy.seen] == [None]  # asked without it
    finally:
        for server in (elsewhere, redirecting, healthy):
            server.close()


@pytest.mark.parametrize("body", [b"<html>a web app</html>", b"[1, 2]"])
def test_a_url_that_is_no_rollout_server_is_one_line(body):
    other = _Answer(200, body)
    try:
        with pytest.raises(BackendUnavailable) as caught:
            RemoteServer(other.url, TOKEN, f"the vLLM server at {other.url}").known_health()
        assert (
            str(caught.value)
            == f"the vLLM server at {other.url} answered /health with no rollout server's JSON: is it one?"
        )
    finally:
        other.close()
