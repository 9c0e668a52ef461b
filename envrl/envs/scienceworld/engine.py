"""ScienceWorld's simulator (the Scala jar of ``scienceworld==1.2.3``) in a JVM of its own.

The stock ``scienceworld.ScienceWorldEnv`` starts the jar through py4j and, on every step,
asks the simulator for a dozen things besides the observation (look, inventory, the ~500
valid actions). :class:`Engine` talks to the same Java object
(``scienceworld.runtime.pythonapi.PythonInterface``) but fetches only what is asked for, and
it looks after the Java process:

* Heap and GC are bounded (``-Xmx512m -XX:+UseSerialGC`` by default) and the JVM exits on
  ``OutOfMemoryError`` instead of thrashing.
* The JVM is py4j's ``GatewayServer`` with ``--die-on-broken-pipe``: it reads its stdin and
  exits when that pipe closes, which happens when :meth:`Engine.close` runs, when Python
  exits, and also when the Python process is killed (the kernel closes the pipe). Forked
  children drop their copy of the pipe, so they never keep a parent's JVM alive.
* The simulator prints debug text on every step; its ``System.out`` is replaced by a null
  stream, so nothing has to carry or read those lines.
* py4j's server socket answers with Nagle's algorithm on; any answer over 8 KB then waits
  ~40 ms for a delayed ACK. The engine turns on ``TCP_NODELAY`` on the Java side.
* A JVM that dies (killed, crashed, out of memory) or stops answering raises
  :class:`EngineDiedError` (a ``RuntimeError``) that says what happened, never a py4j
  traceback; a new :class:`Engine` starts a fresh JVM.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from typing import IO, Any, TypedDict

#: JVM options besides the heap size (``java_heap``). ExitOnOutOfMemoryError turns a heap
#: that is too small into a clear EngineDiedError instead of a JVM stuck collecting garbage.
DEFAULT_JAVA_OPTIONS = ("-XX:+UseSerialGC", "-XX:+ExitOnOutOfMemoryError", "-XX:-UsePerfData")
#: Always passed: the engine reads and restores the simulator's random generator (a private
#: field of java.util.Random) so that reading the valid actions never changes the world.
REQUIRED_JAVA_OPTIONS = ("--add-opens", "java.base/java.util=ALL-UNNAMED")
#: With ``deterministic=True``: every identity hash code is the same constant. The simulator
#: keeps objects in hash sets keyed by identity, so with Java's default (per-thread random)
#: hash codes the order in which objects tick, move and are searched changes from one load
#: to the next: a replay of the same actions can score differently and a gold path can fail.
#: A constant hash makes those sets iterate in insertion order; steps take ~1.8x as long.
DETERMINISTIC_JAVA_OPTIONS = ("-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2")
DEFAULT_JAVA_HEAP = "512m"
#: The least ``java_heap`` accepted: the JVM loads and plays every task in it with room to
#: spare (measured with scienceworld 1.2.3 on Java 17: 32m works but collects garbage most of
#: the time, 16m runs out of memory loading ``boil``, 8m cannot start the simulator, and
#: below 2m the JVM itself does not start).
MIN_JAVA_HEAP = "64m"
#: The least ``java_heap`` when gold paths are computed (``expert_plan=True``): computing them
#: takes far more memory than playing (192m ran out on test-conductivity; 256m computed the
#: first variation of every task).
MIN_JAVA_HEAP_FOR_GOLD_PATHS = "256m"
_HEAP_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}  # as -Xmx reads them
#: seconds one call into the JVM may take before the JVM is declared hung and killed
DEFAULT_CALL_TIMEOUT = 300.0
START_TIMEOUT = 60.0
_SEP = "\n"  # no action, object name or gold action contains a newline
_RANDOM_MULTIPLIER = 0x5DEECE66D  # java.util.Random's


class ScienceWorldError(RuntimeError):
    """A problem with the ScienceWorld engine (base class of the engine's errors)."""


class EngineStartError(ScienceWorldError):
    """The JVM could not be started (no java, a bad JVM option, ...)."""


class EngineDiedError(ScienceWorldError):
    """The JVM died, was killed, ran out of memory or stopped answering mid-call."""


class EngineJavaError(ScienceWorldError):
    """The simulator raised a Java exception for a call (the JVM is still alive)."""


def _package_files() -> tuple[str, str, str]:
    """(py4j jar, ScienceWorld jar, ScienceWorld package folder)."""
    try:
        import scienceworld
        from py4j.java_gateway import find_jar_path
    except ImportError as error:  # pragma: no cover - depends on the install
        raise EngineStartError(
            "envrl/ScienceWorld-v0 needs the scienceworld package: pip install 'envrl[scienceworld]' "
            "(scienceworld==1.2.3)"
        ) from error
    folder = os.path.dirname(os.path.abspath(scienceworld.__file__))
    jar = os.path.join(folder, "scienceworld.jar")
    py4j_jar = find_jar_path()
    if not py4j_jar or not os.path.exists(py4j_jar):
        raise EngineStartError("py4j's jar was not found (reinstall py4j)")
    if not os.path.exists(jar):
        raise EngineStartError(f"ScienceWorld's jar is missing: {jar}")
    return py4j_jar, jar, folder


def _split_heap(java_heap: object) -> tuple[int, str] | None:
    """(number, unit) of an ``-Xmx`` size such as ``"512m"``, ``"2g"`` or a byte count; else None."""
    if isinstance(java_heap, bool) or not isinstance(java_heap, (str, int)):
        return None
    match = re.fullmatch(r"([0-9]+)([kmgt]?)", str(java_heap).strip().lower())
    return (int(match.group(1)), match.group(2)) if match else None


def _heap_bytes(java_heap: object) -> int | None:
    split = _split_heap(java_heap)
    return split[0] * _HEAP_UNITS[split[1]] if split else None


def check_java_heap(java_heap: object, minimum: str = MIN_JAVA_HEAP, why: str = "") -> int | None:
    """``java_heap`` in bytes (None: Java's default), or one ValueError that says what works.

    Checked before any JVM starts: a JVM given a size it cannot use prints its complaint
    and exits, which would only surface as a failed start.
    """
    if java_heap is None or java_heap == "":
        return None
    size, least = _heap_bytes(java_heap), _heap_bytes(minimum)
    if size is None or least is None or size < least:
        raise ValueError(
            f"java_heap must be a heap size such as '512m' or '2g' (a whole number with an optional unit "
            f"k, m, g or t; without a unit it counts bytes) of at least {minimum!r}"
            f"{why or ', the least in which ScienceWorld loads and plays every task'}, "
            f"or None for Java's default; got {java_heap!r}"
        )
    return size


def java_heap_option(java_heap: object) -> list[str]:
    """``-Xmx`` for ``java_heap`` (checked), written without leading zeros."""
    if check_java_heap(java_heap) is None:
        return []
    number, unit = _split_heap(java_heap)  # type: ignore[misc]  # checked just above
    return [f"-Xmx{number}{unit}"]


# ---- process hygiene shared by all engines --------------------------------------------

_OUR_PORTS: set[int] = set()


class _QuietConnectionErrors(logging.Filter):
    """Drop py4j's logged tracebacks for connections to our engines' JVMs.

    A JVM that died is reported by EngineDiedError; py4j would also log a traceback for
    each attempt to reach it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "trying to connect to the Java server" in message:
            return not any(message.endswith(f":{port})") for port in _OUR_PORTS)
        return True


logging.getLogger("py4j.java_gateway").addFilter(_QuietConnectionErrors())

_LIVE: weakref.WeakSet[Engine] = weakref.WeakSet()


def _close_all_engines() -> None:
    for engine in list(_LIVE):
        engine.close()


def _forget_engines_in_child() -> None:
    # A forked child shares the parent's pipe to each JVM's stdin; holding it would keep those
    # JVMs alive after the parent dies. Drop the child's copies; the JVMs stay the parent's.
    for engine in list(_LIVE):
        engine._disown()


atexit.register(_close_all_engines)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_engines_in_child)


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


class EngineOptions(TypedDict):
    """The :class:`Engine` arguments an env keeps, to check them once and to start a fresh
    JVM with the same settings whenever the old one died."""

    java_heap: str | int | None
    java_options: list[str]
    deterministic: bool
    call_timeout: float


class Engine:
    """One ScienceWorld simulator in one JVM. Not thread-safe; one caller at a time.

    Arguments:
        java_heap: the JVM's maximum heap (``-Xmx``), e.g. ``"512m"`` (at least :data:`MIN_JAVA_HEAP`);
            None for Java's default.
        java_options: more JVM options, after :data:`DEFAULT_JAVA_OPTIONS` (later ones win).
        deterministic: add :data:`DETERMINISTIC_JAVA_OPTIONS` (replays are then identical).
        java: the ``java`` executable (default: ``$JAVA_HOME/bin/java`` or ``java`` on PATH).
        call_timeout: seconds a single call may take before the JVM is declared hung.
    """

    def __init__(
        self,
        java_heap: str | int | None = DEFAULT_JAVA_HEAP,
        java_options: tuple[str, ...] | list[str] | None = None,
        deterministic: bool = True,
        java: str | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ):
        self.java_options = [
            *java_heap_option(java_heap),
            *DEFAULT_JAVA_OPTIONS,
            *REQUIRED_JAVA_OPTIONS,
            *(DETERMINISTIC_JAVA_OPTIONS if deterministic else ()),
            *(java_options or ()),
        ]
        self.deterministic = deterministic
        self.java = java or self._find_java()
        self.call_timeout = float(call_timeout)
        self.pid: int | None = None
        self.start_seconds = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._command: list[str] = []  # the JVM's command line, for error messages
        self._gateway: Any = None
        self._server: Any = None
        self._string_class: Any = None
        self._rng_seed: Any = None
        self._stderr: IO[bytes] | None = None
        self._port: int | None = None
        self._owner = os.getpid()
        self._dead_reason: str | None = None
        self._start()
        _LIVE.add(self)

    @staticmethod
    def check_options(
        java_heap: str | int | None = DEFAULT_JAVA_HEAP,
        java_options: Any = None,
        deterministic: bool = True,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        """Raise ValueError for options that cannot work, without starting anything."""
        java_heap_option(java_heap)
        if java_options is not None and (
            isinstance(java_options, str) or not all(isinstance(o, str) for o in java_options)
        ):
            raise ValueError(f"java_options must be a list of strings, got {java_options!r}")
        if not call_timeout or call_timeout <= 0:
            raise ValueError(f"call_timeout must be positive, got {call_timeout!r}")

    # ---- life cycle ------------------------------------------------------------------

    @staticmethod
    def _find_java() -> str:
        home = os.environ.get("JAVA_HOME")
        candidate = os.path.join(home, "bin", "java") if home else shutil.which("java")
        if not candidate or not os.path.exists(candidate):
            raise EngineStartError("ScienceWorld needs Java (17 works): no `java` on PATH and no JAVA_HOME")
        return candidate

    def _start(self) -> None:
        from py4j.java_gateway import GatewayParameters, JavaGateway

        py4j_jar, jar, folder = _package_files()
        command = [
            self.java,
            *self.java_options,
            "-cp",
            os.pathsep.join([py4j_jar, jar]),
            "py4j.GatewayServer",
            "--die-on-broken-pipe",
            "0",
        ]
        self._command = command
        started = time.perf_counter()
        stderr = self._stderr = tempfile.TemporaryFile(prefix="envrl-scienceworld-", suffix=".err")
        try:
            # cwd: the simulator reads its data files relative to the package folder, as stock.
            self._proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=folder
            )
        except OSError as error:
            stderr.close()
            raise EngineStartError(f"could not run {self.java!r}: {error}") from error
        self.pid = self._proc.pid
        try:
            port = self._read_port()
            self._port = port
            _OUR_PORTS.add(port)
            # Read the JVM's stdout to the end: nothing comes after the port once System.out is
            # nulled below, but a full pipe must never be able to block the JVM.
            threading.Thread(
                target=self._drain, args=(self._proc.stdout,), daemon=True, name=f"scienceworld-jvm-{self.pid}-stdout"
            ).start()
            self._gateway = JavaGateway(
                gateway_parameters=GatewayParameters(
                    port=port, auto_field=False, auto_close=True, read_timeout=self.call_timeout
                )
            )
            jvm = self._gateway.jvm
            null_stream = jvm.java.io.PrintStream(jvm.java.io.OutputStream.nullOutputStream())
            jvm.java.lang.System.setOut(null_stream)  # before any Scala code captures it
            self._string_class = jvm.java.lang.String
            self._set_nodelay()
            self._server = jvm.scienceworld.runtime.pythonapi.PythonInterface()
            self._rng_seed = self._random_seed_cell()
        except EngineStartError:
            self._kill()
            stderr.close()
            raise
        except Exception as error:
            tail = self.stderr_tail()
            self._gateway_close_quietly()
            self._kill()
            stderr.close()
            raise EngineStartError(
                f"the ScienceWorld JVM (pid {self.pid}) did not come up: {error}"
                + (f". JVM stderr: {tail}" if tail else "")
            ) from None
        except BaseException:
            self._kill()
            stderr.close()
            raise
        self.start_seconds = time.perf_counter() - started

    def _read_port(self) -> int:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EngineStartError(f"the ScienceWorld JVM did not start within {START_TIMEOUT:.0f} s")
            ready, _, _ = select.select([self._proc.stdout], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._proc.stdout.fileno(), 1)
            if not chunk:
                self._proc.wait(timeout=5)
                raise EngineStartError(
                    f"the ScienceWorld JVM {_describe_exit(self._proc.returncode)} at start "
                    f"(command: {' '.join(self._command)}): {self.stderr_tail() or 'no message'}"
                )
            line += chunk
        if not line.strip().isdigit():  # the JVM printed a complaint instead of its port
            raise EngineStartError(self._start_failure(line))
        return int(line)

    def _start_failure(self, first_line: bytes) -> str:
        """What a JVM that printed ``first_line`` instead of its port said, once it has exited."""
        assert self._proc is not None and self._proc.stdout is not None
        try:
            self._proc.wait(timeout=5)
            rest = self._proc.stdout.read(4000)  # the JVM has exited: this cannot block
        except (subprocess.TimeoutExpired, OSError, ValueError):
            rest = b""
        said = " ".join((first_line + rest).decode("utf-8", "replace").split())
        tail = self.stderr_tail()
        return f"the ScienceWorld JVM did not start (command: {' '.join(self._command)}): {said}" + (
            f"; stderr: {tail}" if tail else ""
        )

    @staticmethod
    def _drain(stream) -> None:
        try:
            while stream.read(65536):
                pass
        except (OSError, ValueError):
            pass

    def _set_nodelay(self) -> None:
        """Turn on TCP_NODELAY for py4j's server-side sockets (see the module docstring)."""
        jvm = self._gateway.jvm
        field = jvm.java.lang.Class.forName("py4j.GatewayServer").getDeclaredField("connections")
        field.setAccessible(True)
        connections = field.get(self._gateway.java_gateway_server)
        count = connections.size()
        for index in range(count):
            connections.get(index).getSocket().setTcpNoDelay(True)

    def _random_seed_cell(self) -> tuple[Any, Any]:
        """(the java.util.Random behind scala.util.Random, its private ``seed`` field)."""
        jvm = self._gateway.jvm
        scala_random = jvm.java.lang.Class.forName("scala.util.Random$").getField("MODULE$").get(None)
        field = jvm.java.lang.Class.forName("java.util.Random").getDeclaredField("seed")
        field.setAccessible(True)  # allowed by REQUIRED_JAVA_OPTIONS (--add-opens)
        return scala_random.self(), field

    def _get_random_state(self) -> int:
        generator, field = self._rng_seed
        return int(field.get(generator))  # py4j hands the AtomicLong over as its value

    def _set_random_state(self, state: int) -> None:
        generator, _ = self._rng_seed
        # setSeed(s) stores (s ^ 0x5DEECE66D) masked to 48 bits, so this stores `state` itself
        generator.setSeed(state ^ _RANDOM_MULTIPLIER)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._dead_reason is None

    def stderr_tail(self, limit: int = 2000) -> str:
        """The end of what the JVM wrote to stderr (e.g. ``OutOfMemoryError``)."""
        if self._stderr is None or self._stderr.closed:
            return ""
        try:
            size = self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, size - limit))
            return self._stderr.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        """Stop the JVM (idempotent). Closing its stdin makes it exit; a kill follows if not."""
        _LIVE.discard(self)
        if self._owner != os.getpid():
            return
        self._gateway_close_quietly()
        proc = self._proc
        if proc is not None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()  # EOF: GatewayServer --die-on-broken-pipe exits
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill()
            for stream in (proc.stdout,):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass
        if self._stderr is not None:
            self._stderr.close()
        self._dead_reason = self._dead_reason or "closed"

    def _kill(self) -> None:
        proc = self._proc
        if proc is None or self._owner != os.getpid():
            return
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a kill is not refused
            pass

    def _disown(self) -> None:
        """In a forked child: let go of the parent's JVM without touching it.

        The child closes its copies of the JVM's pipes (so the JVM still dies with the
        parent) and of py4j's sockets, without py4j's shutdown, which would cut the parent's
        connection; py4j's finalizers for the parent's Java objects are dropped too.
        """
        _LIVE.discard(self)
        self._owner = -1
        self._dead_reason = "inherited across fork; this process needs an engine of its own"
        gateway, self._gateway, self._server = self._gateway, None, None
        self._forget_java_objects()
        client = getattr(gateway, "_gateway_client", None)
        for connection in list(getattr(client, "deque", None) or ()):
            sock = getattr(connection, "socket", None)
            if sock is None:
                continue
            try:
                os.close(sock.detach())
            except Exception:  # noqa: BLE001 - already closed or not a socket
                pass
        proc = self._proc
        if proc is not None:
            # Point the pipe descriptors at /dev/null instead of closing the file objects: the
            # parent's stdout reader thread held that file's lock when the process forked.
            for stream in (proc.stdin, proc.stdout):
                if stream is None:
                    continue
                try:
                    null = os.open(os.devnull, os.O_RDWR)
                    try:
                        os.dup2(null, stream.fileno())
                    finally:
                        os.close(null)
                except (AttributeError, OSError, ValueError):
                    pass

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ---- calls -----------------------------------------------------------------------

    def _call(self, what: str, function: Callable[[], Any]) -> Any:
        """Run one or more py4j calls; turn any failure into a clear engine error."""
        from py4j.protocol import Py4JError, Py4JJavaError

        if self._dead_reason is not None or self._server is None:
            raise EngineDiedError(
                f"the ScienceWorld engine is not running ({self._dead_reason or 'closed'}); reset() starts a new one"
            )
        try:
            return function()
        except Py4JJavaError as error:
            if self._proc is not None and self._proc.poll() is None:
                message = str(error.java_exception) if error.java_exception is not None else str(error)
                raise EngineJavaError(f"ScienceWorld raised {message} during {what}") from None
            raise self._died(what) from None
        except (Py4JError, OSError, EOFError) as error:
            raise self._died(what, error) from None

    def _died(self, what: str, error: BaseException | None = None) -> EngineDiedError:
        proc = self._proc
        returncode = proc.poll() if proc is not None else None
        if returncode is None and proc is not None:
            try:  # the JVM may be exiting right now (a kill takes a moment)
                returncode = proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                returncode = None
        if returncode is None:
            cause = (
                f"stopped answering ({type(error).__name__ if error else 'no answer'}; "
                f"call timeout {self.call_timeout:.0f} s) and was killed"
            )
            self._kill()
        else:
            cause = _describe_exit(returncode)
        tail = self.stderr_tail(600)
        self._dead_reason = f"the JVM {cause}"
        self._gateway_close_quietly()
        message = (
            f"ScienceWorld's Java process (pid {self.pid}) {cause} during {what}; "
            f"this episode is lost, reset() starts a new JVM"
        )
        if tail:
            message += f". JVM stderr: {tail}"
        return EngineDiedError(message)

    def _gateway_close_quietly(self) -> None:
        gateway, self._gateway, self._server = self._gateway, None, None
        if gateway is not None:
            try:
                gateway.close(keep_callback_server=False, close_callback_server_connections=False)
            except Exception:  # noqa: BLE001
                pass
        self._forget_java_objects()

    def _forget_java_objects(self) -> None:
        """Drop py4j's finalizers for this JVM's objects: they would try to reach a gone JVM."""
        if self._port is None:
            return
        try:
            from py4j.finalizer import ThreadSafeFinalizer
        except ImportError:  # pragma: no cover
            return
        prefix = f"127.0.0.1{self._port}o"
        with ThreadSafeFinalizer.lock:
            for key in [k for k in ThreadSafeFinalizer.finalizers if isinstance(k, str) and k.startswith(prefix)]:
                del ThreadSafeFinalizer.finalizers[key]
        self._string_class = self._rng_seed = None

    def _java_list(self, java_list: Any) -> list[str]:
        """A java.util.List of strings in one round trip (py4j iterates them one call each)."""
        if not java_list.size():
            return []
        joined = self._string_class.join(_SEP, java_list)
        items = joined.split(_SEP)
        if len(items) != java_list.size():  # pragma: no cover - no item contains a newline today
            items = [str(item) for item in java_list]
        return items

    @staticmethod
    def _int_list(java_list: Any) -> list[int]:
        text = str(java_list.toString()).strip("[]")  # "[0, 1, 2]"
        return [int(item) for item in text.split(",")] if text.strip() else []

    # ---- the simulator -----------------------------------------------------------------

    def task_names(self) -> list[str]:
        return self._call("getTaskNames()", lambda: self._java_list(self._server.getTaskNames()))

    def max_variations(self, task_name: str) -> int:
        return int(
            self._call(f"getTaskMaxVariations({task_name!r})", lambda: self._server.getTaskMaxVariations(task_name))
        )

    def split_variations(self, task_name: str) -> dict[str, list[int]]:
        """ScienceWorld's own train/dev/test variations of a task (loads the task)."""

        def run() -> dict[str, list[int]]:
            self._server.load(task_name, 0, "", False)
            return {
                "train": self._int_list(self._server.getVariationsTrain()),
                "dev": self._int_list(self._server.getVariationsDev()),
                "test": self._int_list(self._server.getVariationsTest()),
            }

        return self._call(f"variations of {task_name!r}", run)

    def load(self, task_name: str, variation: int, simplifications: str, gold_path: bool = False) -> list[str] | None:
        """Load (and reset) a task variation; with ``gold_path``, return the gold actions."""

        def run() -> list[str] | None:
            error = self._server.load(task_name, int(variation), simplifications, bool(gold_path))
            if error:
                raise ScienceWorldError(f"ScienceWorld could not load {task_name!r} variation {variation}: {error}")
            if gold_path:
                return self._java_list(self._server.getGoldActionSequence())
            return None

        result = self._call(f"load({task_name!r}, {variation})", run)
        self._call("setTcpNoDelay", self._set_nodelay)  # in case py4j opened another connection
        return result

    def step(self, action: str) -> tuple[str, int, bool]:
        """One action: (observation, score in -100..100 as the stock env rounds it, completed)."""
        try:
            action.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates cannot cross py4j's UTF-8 protocol
            action = action.encode("utf-8", "replace").decode("utf-8")

        def run() -> tuple[str, int, bool]:
            observation = self._server.step(action)
            return observation, int(round(100 * self._server.getScore())), bool(self._server.getCompleted())

        return self._call(f"step({action[:80]!r})", run)

    def valid_actions(self, keep_random_state: bool = True) -> list[str]:
        """The valid action-object combinations now (sorted, as the stock env returns them).

        Computing them draws from the simulator's global random generator (to pick among
        equivalent object names), the same generator that moves bees and animals. With
        ``keep_random_state`` the generator is restored afterwards, so the world does not
        depend on whether (or how often) anyone asked; without it the draws stay, as in the
        stock env, which computes the list after every step.
        """

        def run() -> list[str]:
            seed = self._get_random_state() if keep_random_state else None
            actions = self._java_list(self._server.getValidActionObjectCombinations())
            if seed is not None:
                self._set_random_state(seed)
            return actions

        return self._call("getValidActionObjectCombinations()", run)

    def random_state(self) -> int:
        """The simulator's random generator state (to check that something left it alone)."""
        return self._call("Random.seed", self._get_random_state)

    def task_description(self) -> str:
        return self._call("getTaskDescription()", lambda: self._server.getTaskDescription())

    def look(self) -> str:
        return self._call("freeActionLook()", lambda: self._server.freeActionLook())

    def inventory(self) -> str:
        return self._call("freeActionInventory()", lambda: self._server.freeActionInventory())

    def num_moves(self) -> int:
        return int(self._call("getNumMoves()", lambda: self._server.getNumMoves()))

    def possible_simplifications(self) -> list[str]:
        return self._call(
            "getPossibleSimplifications()", lambda: str(self._server.getPossibleSimplifications()).split(", ")
        )

    def rss_bytes(self) -> int:
        """Resident memory of the JVM (Linux), 0 if unknown."""
        try:
            with open(f"/proc/{self.pid}/statm") as handle:
                return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0
