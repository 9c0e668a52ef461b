"""``envrl webshop serve`` in a subprocess: health, an episode over HTTP, 64 concurrent
sessions, slow clients, clean shutdown on SIGTERM.

``play_episode`` and ``wait_healthy`` are shared with ``test_webshop_container.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

requests = pytest.importorskip("requests")
bs4 = pytest.importorskip("bs4")
pytest.importorskip("gunicorn")

from envrl.envs.webshop.server import HEADER_TIMEOUT  # noqa: E402
from envrl.envs.webshop.store import load_store  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(
    base_url: str, timeout: float = START_TIMEOUT, alive: Any = None, path: str = "/healthz", status: str = "ok"
) -> dict:
    """Poll ``path`` until its JSON says ``status`` (WebShop's /healthz: "ok"; OpenEnv's /health:
    "healthy"); ``alive()`` False (the server died) fails at once."""
    deadline = time.monotonic() + timeout
    last: Exception | str = "no answer"
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise AssertionError(f"the server exited before it was healthy ({last})")
        try:
            response = requests.get(f"{base_url}{path}", timeout=2)
            if response.status_code == 200 and response.json().get("status") == status:
                return response.json()
            last = f"HTTP {response.status_code}"
        except (requests.RequestException, ValueError) as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{base_url}{path} not {status} after {timeout:.0f} s ({last})")


def _soup(response: Any) -> Any:
    assert response.status_code == 200, (response.status_code, response.url, response.text[:200])
    return bs4.BeautifulSoup(response.text, "html.parser")


def _clickable(soup: Any, name: str) -> str:
    link = soup.find("a", attrs={"data-clickable": name})
    assert link is not None, f"no {name!r} on the page"
    return link["href"]


def play_episode(base_url: str, goal_index: int, store: Any, session: Any = None) -> dict:
    """Search the goal product's title, open it, choose the goal's options, buy.

    Checks every page belongs to the session and shows its goal; returns the done page's
    ``reward-info`` payload, with ``expected``: ``store.reward`` for the same purchase.
    """
    http = session or requests.Session()
    sid = f"fixed_{goal_index}"
    goal = store.goals[goal_index]
    instruction = goal["instruction_text"]

    page = _soup(http.get(f"{base_url}/{sid}", timeout=30))
    assert page.body["data-page"] == "search"
    assert page.find(id="instruction").get_text() == instruction

    query = store.by_asin[goal["asin"]]["Title"].lower()
    response = http.post(f"{base_url}/{sid}", data={"search_query": query}, allow_redirects=False, timeout=30)
    assert response.status_code == 302
    location = response.headers["Location"]
    assert location.split("/")[1:3] == ["search_results", sid], location
    page = _soup(http.get(base_url + location if location.startswith("/") else location, timeout=30))
    assert page.body["data-page"] == "results"
    assert page.find(id="instruction").get_text() == instruction
    products = {a.get_text(): a["href"] for a in page.find_all("a", attrs={"data-kind": "product"})}
    assert products, "no results"
    asin = goal["asin"] if goal["asin"] in products else next(iter(products))
    href = products[asin]

    page = _soup(http.get(base_url + href, timeout=30))
    assert page.body["data-page"] == "item" and page.body["data-asin"] == asin
    wanted = goal.get("goal_options") or {}
    for name, value in wanted.items():
        links = [
            a
            for a in page.find_all("a", attrs={"data-kind": "option", "data-option-name": name})
            if a.get_text() == value
        ]
        if links:
            page = _soup(http.get(base_url + links[0]["href"], timeout=30))
    options = json.loads(page.body["data-options"])

    buy = _clickable(page, "buy-now")
    assert buy.split("/")[1:4] == ["done", sid, asin], buy
    page = _soup(http.get(base_url + buy, timeout=30))
    assert page.body["data-page"] == "done"
    payload = json.loads(page.find("script", id="reward-info").string)
    assert payload["session_id"] == sid and payload["goal_index"] == goal_index
    assert payload["asin"] == asin and payload["options"] == options
    expected, info = store.reward(goal_index, asin, options)
    payload["expected"] = float(expected)
    payload["expected_info"] = json.loads(
        json.dumps(info, default=lambda v: sorted(v) if isinstance(v, (set, frozenset)) else str(v))
    )
    return payload


# ---- the server in a subprocess ----------------------------------------------------------------


class Server:
    def __init__(self, *args: str, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "WEBSHOP_PORT"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "envrl.cli",
                "webshop",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *args,
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)

    def text(self) -> str:
        return "".join(self.output)

    def workers(self) -> list[int]:
        """The worker processes (children of the master), from /proc."""
        children = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                    children.append(int(entry.name))
        return children

    def wait_workers(self, count: int, timeout: float = 30.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while len(self.workers()) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.workers()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the master stops its workers
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._reader.join(timeout=5)


@pytest.fixture(scope="module")
def store():
    return load_store()


@pytest.fixture(scope="module")
def server():
    srv = Server("--workers", "2")
    try:
        wait_healthy(srv.url, alive=lambda: srv.proc.poll() is None)
    except AssertionError:
        srv.stop()
        raise AssertionError(f"server did not start:\n{srv.text()}") from None
    yield srv
    srv.stop()


def test_health(server, store):
    health = requests.get(f"{server.url}/healthz", timeout=10).json()
    assert health == {"status": "ok", "products": len(store.products), "goals": len(store.goals)}
    assert f"serving at http://127.0.0.1:{server.port}" in server.text()


def test_one_episode_over_http(server, store):
    goal_index = store.split_goals("test")[0]
    payload = play_episode(server.url, goal_index, store)
    assert payload["reward"] == pytest.approx(payload["expected"], abs=1e-9)
    assert payload["reward_info"] == payload["expected_info"]
    assert payload["asin"] == store.goals[goal_index]["asin"]  # the oracle's search finds the goal product


def test_64_concurrent_sessions(server, store):
    goals = store.split_goals("test")[:64]
    assert len(goals) == 64
    barrier = threading.Barrier(64)

    def one(goal_index: int) -> tuple[int, dict]:
        with requests.Session() as http:
            barrier.wait(timeout=60)
            return goal_index, play_episode(server.url, goal_index, store, session=http)

    with ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(one, goals))
    for goal_index, payload in results:
        assert payload["goal_index"] == goal_index
        assert payload["instruction"] == store.goals[goal_index]["instruction_text"]
        assert payload["reward"] == pytest.approx(payload["expected"], abs=1e-9)
    # the server still has both its workers (none crashed under the load)
    assert len(server.wait_workers(2)) == 2


SLOW_CLIENTS = 40
#: a request whose headers never end; a slow client sends one more byte now and then
SLOW_PREFIX = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def _open_slow_clients(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(SLOW_PREFIX)
        sock.setblocking(False)
        socks.append(sock)
    return socks


def _still_open(sock: socket.socket) -> bool:
    """Send the slow client's next byte; False once the server has closed (or answered) it."""
    try:
        sock.recv(4096)  # b"" (closed) or a response: either way the hold is over
        return False
    except BlockingIOError:
        pass
    except OSError:
        return False
    try:
        sock.send(b"a")
        return True
    except OSError:
        return False


@pytest.mark.timeout(60)
def test_slow_clients_neither_block_the_server_nor_hold_it_for_long(server, store):
    """40 connections trickling unfinished headers (a "slowloris"; the gthread workers had one
    thread per such connection, and /healthz then waited over 90 s): the server still answers
    at once, and it closes each slow connection once its ``HEADER_TIMEOUT`` is up."""
    socks = _open_slow_clients(server.port, SLOW_CLIENTS)
    try:
        opened = time.monotonic()
        for _ in range(3):
            time.sleep(0.5)
            assert all(_still_open(sock) for sock in socks)  # held, not refused
            started = time.monotonic()
            assert requests.get(f"{server.url}/healthz", timeout=2).status_code == 200
            assert time.monotonic() - started < 2
        payload = play_episode(server.url, store.split_goals("test")[1], store)
        assert payload["reward"] == pytest.approx(payload["expected"], abs=1e-9)

        held = list(socks)
        deadline = opened + HEADER_TIMEOUT + 10
        while held and time.monotonic() < deadline:
            time.sleep(0.25)
            held = [sock for sock in held if _still_open(sock)]
        assert not held, f"{len(held)} slow connections still open {time.monotonic() - opened:.1f} s on"
        assert time.monotonic() - opened > HEADER_TIMEOUT - 1  # and not cut before their time
    finally:
        for sock in socks:
            sock.close()


def test_bad_options_exit_with_usage_error():
    proc = subprocess.run(
        [sys.executable, "-m", "envrl.cli", "webshop", "serve", "--workers", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--workers must be >= 1" in proc.stderr


def test_sigterm_stops_cleanly(store):
    srv = Server("--workers", "2")
    try:
        wait_healthy(srv.url, alive=lambda: srv.proc.poll() is None)
        workers = srv.wait_workers(2)
        assert len(workers) == 2
        # a request in flight on a kept-alive connection does not block the shutdown
        with requests.Session() as http:
            assert http.get(f"{srv.url}/fixed_0", timeout=10).status_code == 200
            started = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            assert srv.proc.wait(timeout=20) == 0
            took = time.monotonic() - started
            print(f"SIGTERM -> exit in {took:.2f} s")
        srv._reader.join(timeout=5)
        text = srv.text()
        assert "Traceback" not in text, text
        assert "Shutting down" in text
        assert took < 10, f"SIGTERM took {took:.1f} s"
        for pid in workers:  # the workers are gone too
            assert not Path(f"/proc/{pid}").exists() or "zombie" in _state(pid)
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{srv.url}/healthz", timeout=2)
    finally:
        srv.stop()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "zombie"


def test_page_urls_decode_to_the_session(server, store):
    """Each session's links carry its own id (the site keeps no state between requests)."""
    for goal_index in (0, 5):
        sid = f"fixed_{goal_index}"
        response = requests.post(f"{server.url}/{sid}", data={"search_query": "shoes"}, timeout=10)
        soup = _soup(response)
        hrefs = [a["href"] for a in soup.find_all("a") if a.get("href", "").startswith("/")]
        assert hrefs and all(unquote(h).split("/")[1] == sid or unquote(h).split("/")[2] == sid for h in hrefs)


def test_gym_env_over_http_equals_in_process(server):
    """The same oracle episodes through ``server_url=`` and in-process: identical, byte for byte."""
    import gymnasium as gym

    import envrl  # noqa: F401  (registers the ids)

    def play(env: gym.Env, task_id: str) -> list:
        observation, info = env.reset(options={"task_id": task_id})
        trace = [(observation, info["admissible_actions"])]
        for _ in range(15):
            observation, reward, terminated, truncated, info = env.step(info["expert_plan"][0])
            trace.append((observation, reward, terminated, info["admissible_actions"]))
            if terminated or truncated:
                break
        return trace

    remote = gym.make("envrl/WebShop-v0", split="test", server_url=server.url, expert_plan=True)
    local = gym.make("envrl/WebShop-v0", split="test", expert_plan=True)
    try:
        for task_id in remote.unwrapped.task_ids[:2]:
            over_http = play(remote, task_id)
            assert over_http[-1][2] and over_http[-1][1] > 0
            assert over_http == play(local, task_id)
    finally:
        remote.close()
        local.close()
