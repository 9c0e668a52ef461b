"""Load on the WebShop server (``envrl webshop serve``): throughput, latency, memory, search.

Starts the server (gunicorn, ``--workers`` gevent workers) on a free local port and drives
``--sessions`` concurrent sessions over HTTP for ``--duration`` seconds (after a short warm-up).
Each session plays whole episodes, each under a new session id (so thousands of distinct
sessions hit the server): search page, search (POST, 302), results, product page, one page
per goal option, the Description sub-page, Buy Now; the done page's reward is checked against
``store.reward`` computed here. The clients run in ``--client-procs`` processes so that the
client's GIL is not the bottleneck (on a small machine they still share the CPUs with the server).

Reports requests/s, episodes/s, p50/p99 latency overall and per route, the server's memory
before and after (RSS summed over master and workers, which counts the copy-on-write pages the
workers share once per process, and PSS summed, which divides them: the real footprint), and
search latency at 1,000 and ``--large`` (default 100,000) products, in-process
(``store.search``) and over HTTP (a results page, served by a 1-worker server). The first run
at 100,000 products generates and caches that catalog (~30 s; ~12 s to load afterwards).

Slow clients (``--slow-clients``, default 40; 0 skips): the same load is driven a second time
while that many extra connections hold a request's headers open, sending one more byte every
``--slow-interval`` seconds and never the blank line that ends them (a "slowloris", which no
per-read timeout stops), reconnecting whenever the server closes one. Reported beside the
normal load: the normal requests' p50/p99, errors and timeouts (``--request-timeout``), how
long ``/healthz`` took, and how long the server let a slow connection hold its headers.
All traffic goes to 127.0.0.1; every loop is bounded in count and time.

    python benchmarks/webshop_load.py [--workers 2] [--sessions 64] [--duration 20]
                                      [--slow-clients 40] [--large 100000 | --large 0] [--json out.json]

Takes about a minute and a half on 2 cores (two and a half with the first 100,000-product run).
"""

from __future__ import annotations

import argparse
import html
import http.client
import json
import multiprocessing
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from envrl.envs.webshop import site  # noqa: E402
from envrl.envs.webshop.store import build_store, load_store  # noqa: E402

ROUTES = ("search", "search_post", "results", "item", "option", "item_sub", "done")
_PRODUCT_LINK = re.compile(r'data-kind="product"[^>]*href="([^"]+)">([^<]+)</a>')
_REWARD_INFO = re.compile(r'<script type="application/json" id="reward-info">(.*?)</script>', re.S)


# ---- the server -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """``envrl webshop serve`` in a subprocess, until ``stop()``."""

    def __init__(self, workers: int, products: int | None = None, timeout: float = 300):
        self.port = _free_port()
        args = [
            sys.executable,
            "-m",
            "envrl.cli",
            "webshop",
            "serve",
            "--port",
            str(self.port),
            "--workers",
            str(workers),
            "--log-level",
            "warning",
        ]
        if products:
            args += ["--products", str(products)]
        started = time.perf_counter()
        self.proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited with {self.proc.returncode}:\n{self.proc.stderr.read()}")
            try:
                status, _ = _get(self.port, "/healthz")
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the server did not answer /healthz in {timeout:.0f} s")
            time.sleep(0.05)
        self.start_s = time.perf_counter() - started
        deadline = time.monotonic() + 30
        while len(self.pids()) < workers + 1 and time.monotonic() < deadline:
            time.sleep(0.05)

    def pids(self) -> list[int]:
        """The master and its workers."""
        pids = [self.proc.pid]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                if ppid == self.proc.pid:
                    pids.append(int(entry.name))
        return pids

    def memory(self) -> dict[str, float]:
        """MB: RSS and PSS summed over the master and the workers, and the largest RSS."""
        rss, pss, largest = 0, 0, 0
        for pid in self.pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
                rss += kb
                largest = max(largest, kb)
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
                pss += int(re.search(r"^Pss:\s+(\d+)", rollup, re.M).group(1))
            except (OSError, AttributeError):
                continue
        return {
            "processes": len(self.pids()),
            "rss_sum_mb": rss / 1024,
            "pss_sum_mb": pss / 1024,
            "rss_max_mb": largest / 1024,
        }

    def stop(self) -> float:
        """SIGTERM; returns the seconds until the server exited."""
        started = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return time.perf_counter() - started


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8")
    finally:
        conn.close()


# ---- the clients ----------------------------------------------------------------------------


class Session:
    """One client: a kept-alive connection playing episodes back to back."""

    def __init__(self, port: int, store: Any, name: str, timeout: float = 60.0):
        self.port, self.store, self.name = port, store, name
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.samples: list[tuple[int, float]] = []  # (route index, seconds)
        self.episodes = self.errors = self.timeouts = self.mismatches = self.started = 0
        self.record = False

    def _request(self, route: str, method: str, path: str, body: str | None = None) -> tuple[int, str, Any]:
        headers = {"Content-Type": "application/x-www-form-urlencoded"} if body is not None else {}
        for attempt in (0, 1):
            started = time.perf_counter()
            try:
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                text = response.read().decode("utf-8")
                break
            except (OSError, http.client.HTTPException):
                self.conn.close()  # a closed keep-alive: reconnect once
                if attempt:
                    raise
        if self.record:
            self.samples.append((ROUTES.index(route), time.perf_counter() - started))
        return response.status, text, response

    def episode(self, number: int) -> None:
        sid = f"{self.name}-{number}"
        self.started += 1
        store = self.store
        goal_index = store.goal_for_session(sid)
        goal = store.goals[goal_index]
        status, _, _ = self._request("search", "GET", site.search_url(sid))
        query = store.by_asin[goal["asin"]]["Title"].lower()
        status2, _, response = self._request(
            "search_post", "POST", site.search_url(sid), urlencode({"search_query": query})
        )
        if status != 200 or status2 != 302:
            raise RuntimeError(f"search {status}, post {status2}")
        status, text, _ = self._request("results", "GET", response.getheader("Location"))
        links = {html.unescape(asin): html.unescape(href) for href, asin in _PRODUCT_LINK.findall(text)}
        if status != 200 or not links:
            raise RuntimeError(f"results {status}, {len(links)} products")
        asin = goal["asin"] if goal["asin"] in links else next(iter(links))
        keywords = query.split(" ")
        self._expect("item", links[asin])
        product = store.by_asin[asin]
        chosen: dict[str, str] = {}
        for name, value in (goal.get("goal_options") or {}).items():
            if value in (product.get("options") or {}).get(name, []):
                chosen[name] = value
                chosen = {key: chosen[key] for key in product["options"] if key in chosen}
                self._expect("option", site.item_url(sid, asin, keywords, 1, chosen))
        self._expect("item_sub", site.item_sub_url(sid, asin, keywords, 1, "Description", chosen))
        text = self._expect("done", site.done_url(sid, asin, chosen))
        payload = json.loads(_REWARD_INFO.search(text).group(1))
        if abs(payload["reward"] - float(store.reward(goal_index, asin, chosen)[0])) > 1e-9:
            self.mismatches += 1
        self.episodes += self.record

    def _expect(self, route: str, path: str) -> str:
        status, text, _ = self._request(route, "GET", path)
        if status != 200:
            raise RuntimeError(f"{route} {status}: {text[:100]}")
        return text


def _client_process(
    port: int, threads: int, proc_index: int, warmup: float, duration: float, queue: Any, timeout: float, tag: str
) -> None:
    store = load_store()
    sessions = [Session(port, store, f"load{tag}{proc_index}x{t}", timeout) for t in range(threads)]
    start = time.monotonic() + 0.5
    record_at, stop_at = start + warmup, start + warmup + duration

    def run(session: Session) -> None:
        time.sleep(max(0.0, start - time.monotonic()))
        number = 0
        while time.monotonic() < stop_at:
            session.record = time.monotonic() >= record_at
            try:
                session.episode(number)
            except TimeoutError:  # the server did not answer within --request-timeout
                session.timeouts += time.monotonic() >= record_at  # failures count when they end
                session.conn.close()
            except Exception:  # noqa: BLE001 - counted, the load goes on
                session.errors += time.monotonic() >= record_at
                session.conn.close()
            number += 1

    workers = [threading.Thread(target=run, args=(s,)) for s in sessions]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    queue.put(
        {
            "samples": [sample for s in sessions for sample in s.samples],
            "episodes": sum(s.episodes for s in sessions),
            "errors": sum(s.errors for s in sessions),
            "timeouts": sum(s.timeouts for s in sessions),
            "mismatches": sum(s.mismatches for s in sessions),
            "session_ids": sum(s.started for s in sessions),
        }
    )


def drive(
    port: int,
    sessions: int,
    client_procs: int,
    warmup: float,
    duration: float,
    memory: Any = None,
    timeout: float = 60.0,
    tag: str = "",
) -> dict:
    """``sessions`` clients playing episodes for ``warmup + duration`` s; ``tag`` keeps the
    session ids of two runs apart."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    shares = [sessions // client_procs + (1 if i < sessions % client_procs else 0) for i in range(client_procs)]
    procs = [
        ctx.Process(target=_client_process, args=(port, n, i, warmup, duration, queue, timeout, tag))
        for i, n in enumerate(shares)
        if n
    ]
    for proc in procs:
        proc.start()
    # the server's memory while the load runs, every ~1/8 of the measured time
    timeline = []
    if memory is not None:
        begin = time.monotonic() + 0.5 + warmup
        for step in range(1, 9):
            time.sleep(max(0.0, begin + duration * step / 8 - 0.2 - time.monotonic()))
            timeline.append({"t_s": round(time.monotonic() - begin, 1), **memory()})
    results = [queue.get(timeout=warmup + duration + 2 * timeout + 300) for _ in procs]
    for proc in procs:
        proc.join()
    samples = [sample for r in results for sample in r["samples"]]
    out: dict[str, Any] = {
        "requests": len(samples),
        "requests_per_s": len(samples) / duration,
        "episodes": sum(r["episodes"] for r in results),
        "episodes_per_s": sum(r["episodes"] for r in results) / duration,
        "errors": sum(r["errors"] for r in results),
        "timeouts": sum(r["timeouts"] for r in results),
        "reward_mismatches": sum(r["mismatches"] for r in results),
        "distinct_session_ids": sum(r["session_ids"] for r in results),
        "memory_timeline": timeline,
        "latency_ms": {"all": _percentiles([s for _, s in samples])},
    }
    for index, route in enumerate(ROUTES):
        out["latency_ms"][route] = _percentiles([s for r, s in samples if r == index])
    return out


def _percentiles(seconds: list[float]) -> dict[str, float]:
    if not seconds:
        return {
            "n": 0,
            "p50": float("nan"),
            "p90": float("nan"),
            "p99": float("nan"),
            "max": float("nan"),
            "mean": float("nan"),
        }
    ordered = sorted(seconds)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "n": len(ordered),
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "max": ordered[-1] * 1000,
        "mean": statistics.fmean(ordered) * 1000,
    }


# ---- slow clients ---------------------------------------------------------------------------

#: what a slow client sends first: a request whose headers never end (one byte more per interval)
SLOW_PREFIX = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


class SlowClients:
    """``count`` connections holding unfinished request headers until ``stop()`` (a thread).

    Each sends ``SLOW_PREFIX``, then one byte every ``interval`` s, so it is never idle and never
    done. When the server closes one (or answers it, 408/400), it is reconnected, as an attacker
    would; how long each was held says how long the server lets a client take over its headers.
    Bounded: at most ``100 * count`` connections and ``max_seconds`` in all.
    """

    def __init__(self, port: int, count: int, interval: float, max_seconds: float):
        self.port, self.count, self.interval = port, count, interval
        self.deadline = time.monotonic() + max_seconds
        self.budget = 100 * count
        self.opened = self.closed_by_server = self.connect_failures = 0
        self.held_s: list[float] = []  # per connection the server closed: seconds it was held
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-clients", daemon=True)

    def start(self, settle: float = 1.0) -> None:
        """Start, and return once all ``count`` connections are open (or 10 s passed) + ``settle`` s."""
        self._thread.start()
        limit = time.monotonic() + 10
        while self.opened < self.count and time.monotonic() < limit:
            time.sleep(0.05)
        time.sleep(settle)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=30)
        held = sorted(self.held_s)
        return {
            "count": self.count,
            "interval_s": self.interval,
            "opened": self.opened,
            "closed_by_server": self.closed_by_server,
            "connect_failures": self.connect_failures,
            "held_s_median": held[len(held) // 2] if held else None,
            "held_s_max": held[-1] if held else None,
        }

    def _connect(self) -> tuple[socket.socket, float] | None:
        if self.budget <= 0:
            return None
        self.budget -= 1
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            sock.sendall(SLOW_PREFIX)
        except OSError:
            self.connect_failures += 1
            return None
        sock.setblocking(False)
        self.opened += 1
        return sock, time.monotonic()

    @staticmethod
    def _server_closed(sock: socket.socket) -> bool:
        """The server closed the connection or answered it (either ends the hold)."""
        try:
            sock.recv(4096)  # b"" (closed) or an error page (408, 400): the hold is over either way
            return True
        except BlockingIOError:
            return False
        except OSError:
            return True

    def _run(self) -> None:
        conns = [self._connect() for _ in range(self.count)]
        while not self._stop.wait(self.interval) and time.monotonic() < self.deadline:
            for i, conn in enumerate(conns):
                conns[i] = self._tick(conn)
        for conn in conns:
            if conn is not None:
                conn[0].close()

    def _tick(self, conn: tuple[socket.socket, float] | None) -> tuple[socket.socket, float] | None:
        """One more byte on an open connection; a new connection for one the server ended."""
        if conn is None:
            return self._connect()
        sock, since = conn
        if not self._server_closed(sock):
            try:
                sock.send(b"a")
                return conn
            except OSError:
                pass
        self.closed_by_server += 1
        self.held_s.append(time.monotonic() - since)
        sock.close()
        return self._connect()


def probe_health(port: int, times: int, timeout: float) -> dict:
    """``times`` GET /healthz on new connections, one after the other: seconds each (or a timeout)."""
    took, failed = [], 0
    for _ in range(times):
        started = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                took.append(time.perf_counter() - started)
            else:
                failed += 1
        except (OSError, http.client.HTTPException):
            failed += 1
        finally:
            conn.close()
    took.sort()
    return {
        "probes": times,
        "failed": failed,
        "timeout_s": timeout,
        "median_s": took[len(took) // 2] if took else None,
        "max_s": took[-1] if took else None,
    }


def slow_client_load(port: int, args: argparse.Namespace) -> dict:
    """The normal load again, with ``args.slow_clients`` slow connections held open meanwhile."""
    budget = args.warmup + args.duration + 4 * args.request_timeout + 120
    slow = SlowClients(port, args.slow_clients, args.slow_interval, max_seconds=budget)
    slow.start()
    try:
        health = probe_health(port, 5, timeout=args.request_timeout)
        load = drive(
            port, args.sessions, args.client_procs, args.warmup, args.duration, timeout=args.request_timeout, tag="slow"
        )
    finally:
        held = slow.stop()
    return {"slow_clients": held, "healthz": health, "load": load}


# ---- search latency -------------------------------------------------------------------------


def _queries(store: Any, count: int) -> list[str]:
    """The oracle's queries (goal product titles) and instruction-like ones, half each."""
    queries = []
    for goal in store.goals[:count]:
        queries.append(store.by_asin[goal["asin"]]["Title"].lower())
        queries.append(goal["instruction_text"].lower())
    return queries[:count]


def search_latency(products: int, http_rounds: int, inproc_rounds: int) -> dict:
    started = time.perf_counter()
    # a fresh build for small catalogs (the process already holds the default one); the large
    # one is loaded once: from the disk cache, or generated and cached on the first run
    store = build_store(products) if products <= 10_000 else load_store(products)
    load_s = time.perf_counter() - started
    queries = _queries(store, max(http_rounds, inproc_rounds))
    store.search(queries[0])  # warm
    timings = []
    for query in queries[:inproc_rounds]:
        t = time.perf_counter()
        store.search(query)
        timings.append(time.perf_counter() - t)
    result: dict[str, Any] = {
        "products": len(store.products),
        "store_load_s": load_s,
        "inprocess_ms": _percentiles(timings),
    }
    server = Server(workers=1, products=products)
    try:
        result["server_start_s"] = server.start_s
        result["server_memory"] = server.memory()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        timings = []
        for i, query in enumerate(queries[:http_rounds]):
            path = site.results_url(f"fixed_{i % len(store.goals)}", query.split(" "), 1)
            t = time.perf_counter()
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            timings.append(time.perf_counter() - t)
            if response.status != 200:
                raise SystemExit(f"results page {response.status} for {query!r}")
        conn.close()
        result["http_results_page_ms"] = _percentiles(timings[1:])
    finally:
        server.stop()
    return result


# ---- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers (default 2)")
    parser.add_argument("--sessions", type=int, default=64, help="concurrent sessions (default 64)")
    parser.add_argument("--client-procs", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds of load (default 20)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring (default 2)")
    parser.add_argument(
        "--large", type=int, default=100_000, help="the large catalog for search latency (default 100000; 0 skips it)"
    )
    parser.add_argument(
        "--search-queries",
        type=int,
        default=200,
        help="queries over HTTP per catalog (4x as many in-process; default 200)",
    )
    parser.add_argument(
        "--slow-clients",
        type=int,
        default=40,
        help="connections holding unfinished headers during a second load run (default 40; 0 skips)",
    )
    parser.add_argument(
        "--slow-interval", type=float, default=1.0, help="seconds between the bytes a slow client sends (default 1)"
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=10.0,
        help="seconds a load request may take before it counts as a timeout (default 10)",
    )
    parser.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if min(args.workers, args.sessions, args.client_procs) < 1 or args.duration <= 0:
        parser.error("--workers, --sessions, --client-procs must be >= 1 and --duration > 0")
    if args.slow_clients < 0 or args.slow_interval <= 0 or args.request_timeout <= 0:
        parser.error("--slow-clients must be >= 0, --slow-interval and --request-timeout > 0")

    report: dict[str, Any] = {
        "workers": args.workers,
        "sessions": args.sessions,
        "client_procs": args.client_procs,
        "duration_s": args.duration,
        "cpus": len(os.sched_getaffinity(0)),
        "python": sys.version.split()[0],
    }
    load_store()  # before forking the clients
    print(f"starting the server: {args.workers} gevent workers ...", flush=True)
    server = Server(args.workers)
    try:
        report["server_start_s"] = server.start_s
        report["memory_before"] = server.memory()
        print(f"driving {args.sessions} sessions for {args.duration:.0f} s ...", flush=True)
        report["load"] = drive(
            server.port,
            args.sessions,
            args.client_procs,
            args.warmup,
            args.duration,
            memory=server.memory,
            timeout=args.request_timeout,
        )
        report["memory_after"] = server.memory()
        if args.slow_clients:
            print(f"driving them again with {args.slow_clients} slow clients holding connections ...", flush=True)
            report["slow"] = slow_client_load(server.port, args)
    finally:
        report["server_stop_s"] = server.stop()

    report["search"] = {}
    sizes = [1000] + ([args.large] if args.large else [])
    for size in sizes:
        print(f"search latency at {size:,} products ...", flush=True)
        report["search"][str(size)] = search_latency(size, args.search_queries, 4 * args.search_queries)

    print_report(report)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"\nwritten to {args.json_out}")
    return 0


def print_report(report: dict) -> None:
    load = report["load"]
    print()
    print(
        f"WebShop server: {report['workers']} gevent workers, {report['sessions']} sessions "
        f"({report['client_procs']} client processes), {report['duration_s']:.0f} s, {report['cpus']} CPUs"
    )
    print(
        f"  {load['requests']:,} requests = {load['requests_per_s']:,.0f} req/s; "
        f"{load['episodes']:,} episodes = {load['episodes_per_s']:,.1f}/s; "
        f"errors {load['errors']}, timeouts {load['timeouts']}, reward mismatches {load['reward_mismatches']}"
    )
    print(f"  {load['distinct_session_ids']:,} distinct session ids in all (one per episode, warm-up included)")
    print(
        f"  server start {report['server_start_s']:.2f} s (to /healthz), stop {report['server_stop_s']:.2f} s (SIGTERM)"
    )
    print()
    print(f"  {'route':<12} {'n':>8} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for route, stats in load["latency_ms"].items():
        print(f"  {route:<12} {stats['n']:>8,} {stats['p50']:>8.1f} {stats['p99']:>8.1f} {stats['mean']:>8.1f}")
    if "slow" in report:
        print_slow(report["slow"], load)
    print()
    before, after = report["memory_before"], report["memory_after"]
    print(f"  server memory (MB)  {'before':>8} {'after':>8}   ({before['processes']} processes)")
    for key, label in (("rss_sum_mb", "RSS sum"), ("pss_sum_mb", "PSS sum"), ("rss_max_mb", "RSS max")):
        print(f"  {label:<18}  {before[key]:>8.1f} {after[key]:>8.1f}")
    timeline = load["memory_timeline"]
    if timeline:
        print(
            "  under load, RSS sum / PSS sum (MB) at t s: "
            + ", ".join(f"{m['t_s']:.0f}: {m['rss_sum_mb']:.0f}/{m['pss_sum_mb']:.0f}" for m in timeline)
        )
    print()
    sizes = list(report["search"])
    print(f"  {'search (ms)':<30}" + "".join(f"{int(s):>14,} products" for s in sizes))
    rows = (
        ("in-process p50", "inprocess_ms", "p50"),
        ("in-process p99", "inprocess_ms", "p99"),
        ("HTTP results page p50", "http_results_page_ms", "p50"),
        ("HTTP results page p99", "http_results_page_ms", "p99"),
    )
    for label, key, q in rows:
        print(f"  {label:<30}" + "".join(f"{report['search'][s][key][q]:>23.2f}" for s in sizes))
    print(
        f"  {'store load in-process (s)':<30}" + "".join(f"{report['search'][s]['store_load_s']:>23.2f}" for s in sizes)
    )
    print(
        f"  {'server start, 1 worker (s)':<30}"
        + "".join(f"{report['search'][s]['server_start_s']:>23.2f}" for s in sizes)
    )
    print(
        f"  {'server PSS, 1 worker (MB)':<30}"
        + "".join(f"{report['search'][s]['server_memory']['pss_sum_mb']:>23.0f}" for s in sizes)
    )


def print_slow(slow: dict, normal: dict) -> None:
    """The slow-client run beside the normal one."""
    held, health, load = slow["slow_clients"], slow["healthz"], slow["load"]
    print()
    print(f"  with {held['count']} slow clients (a header byte every {held['interval_s']:g} s):")
    print(f"  {'':<22} {'normal':>10} {'slow clients':>13}")
    for label, key in (("requests/s", "requests_per_s"), ("errors", "errors"), ("timeouts", "timeouts")):
        print(f"  {label:<22} {normal[key]:>10,.0f} {load[key]:>13,.0f}")
    for q in ("p50", "p99"):
        print(
            f"  {'all ' + q + ' ms':<22} {normal['latency_ms']['all'][q]:>10.1f} {load['latency_ms']['all'][q]:>13.1f}"
        )
    answered = health["probes"] - health["failed"]
    print(
        f"  /healthz: {answered}/{health['probes']} answered within {health['timeout_s']:g} s"
        + (f", median {health['median_s'] * 1000:.1f} ms, max {health['max_s'] * 1000:.1f} ms" if answered else "")
    )
    if held["held_s_max"] is not None:
        print(
            f"  the server closed {held['closed_by_server']} slow connections after {held['held_s_median']:.1f} s "
            f"(median; max {held['held_s_max']:.1f} s; seen to within {held['interval_s']:g} s); "
            f"{held['opened']} opened in all"
        )
    else:
        print(f"  the server closed no slow connection ({held['opened']} opened)")


if __name__ == "__main__":
    sys.exit(main())
