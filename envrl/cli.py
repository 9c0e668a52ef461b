"""The ``envrl`` command.

    envrl eval --env alfworld --split valid_unseen --agent expert --episodes 20 --workers 4
    envrl eval --env alfworld --split valid_unseen --agent random --episodes 200 --workers 32 --ray auto
    envrl eval --env webshop --split test --agent hf:Qwen/Qwen2.5-1.5B-Instruct --episodes 500 --batch-size 16
    envrl eval --env alfworld --split valid_unseen --agent openai:qwen@http://gpu-box:8000/v1 --episodes 134
    envrl leaderboard [--format text|markdown|json] [--runs]
    envrl serve [--runs-dir DIR] [--port 8050]          # the leaderboard, run pages and trajectories
    envrl serve-model CHECKPOINT [--port 8000]          # an OpenAI-compatible server for a checkpoint
    envrl serve-env --env textworld --split valid [--port 8000]   # an env over OpenEnv (envrl[openenv])
    envrl data alfworld --download [--dest DIR]
    envrl webshop serve [--host H] [--port P] [--workers N] [--products N] [--data-dir D]
    envrl train --algo NAME --env E --model DIR --out DIR [--data DIR]   # see envrl/training
    envrl probe --checkpoint DIR --env textworld --split valid [--episodes 10]        # world-model probes

The subcommands are the rows of :data:`COMMANDS` (their parent commands, such as ``data``, the
entries of :data:`GROUPS`); :func:`build_parser` walks the table. A new subcommand is one row and
one function that adds its arguments. Env names in the help come from :data:`envrl.envs.REGISTRY`
and algorithm names from :data:`envrl.training.algorithms.ALGORITHMS`; the ``data <env>`` rows
(official downloads) come from the env descriptors that name a ``downloader`` module
(:func:`download_commands`).

Exit codes: 0 success, 1 the run could not go on (e.g. locked by another process, a runs
directory that cannot be read or written, a corrupt results database), 2 bad input (one line
on stderr, never a traceback), 130 interrupted (Ctrl-C / SIGTERM; everything finished so far
is kept; the same command resumes). An unexpected exception is reported in one line too
(``ENVRL_TRACEBACK=1`` shows its traceback).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envrl.envs import REGISTRY, add_env_arg_option, parse_env_args
from envrl.envs.descriptor import EnvDescriptor
from envrl.ports import port_argument

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    """argparse, but errors exit through :class:`_UsageError` so ``main`` returns a code.

    ``epilog_from`` makes the epilog when the help is printed, not when the parser is built:
    text whose source is costly to import (the algorithm registry imports torch) then costs
    nothing to ``envrl --help`` or to a command that is run.
    """

    def __init__(self, *args: Any, epilog_from: Callable[[], str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._epilog_from = epilog_from

    def format_help(self) -> str:
        if self._epilog_from is not None:
            self.epilog = self._epilog_from()
        return super().format_help()

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        raise _UsageError(f"{self.prog}: error: {message}")


class _UsageError(Exception):
    pass


def _fail(prog: str, message: str, code: int = EXIT_USAGE) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


@dataclass(frozen=True)
class Lazy:
    """The function ``target`` (``"module:function"``), imported when it is first called.

    The table names the training commands' argument functions and handlers this way: their
    modules are imported only when the parser is built or the command runs, not with this module.
    """

    target: str

    def resolve(self) -> Callable[..., Any]:
        """The function itself (importing its module)."""
        module, _, name = self.target.partition(":")
        function: Callable[..., Any] = getattr(importlib.import_module(module), name)
        return function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


def _registered_envs() -> str:
    """The registered envs' short names, for ``--env`` help (importing the registry imports no engine)."""
    return ", ".join(REGISTRY)


# ---- eval --------------------------------------------------------------------------------


def _eval_arguments(ev: argparse.ArgumentParser) -> None:
    ev.add_argument("--env", required=True, help=f"a registered env ({_registered_envs()}) or a gymnasium id")
    ev.add_argument("--split", required=True, help="split name (e.g. valid_unseen)")
    ev.add_argument("--agent", required=True, help="agent spec (e.g. random, expert)")
    ev.add_argument("--episodes", type=int, required=True, help="number of episodes (>= 1)")
    ev.add_argument("--workers", type=int, default=1, help="worker processes, or Ray actors with --ray (default 1)")
    ev.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="play the episodes on Ray actors: a cluster address (host:6379, ray://host:10001), "
        "'auto' (a running cluster, else a local instance) or 'local' (a new local instance)",
    )
    ev.add_argument("--seed", type=int, default=0, help="base seed; episode i uses seed + i (default 0)")
    ev.add_argument("--run-id", default=None, help="run id (default: <env>-<split>-<agent>-s<seed>)")
    ev.add_argument("--runs-dir", default=None, help="results directory (default $ENVRL_RUNS_DIR or ./runs)")
    ev.add_argument("--max-steps", type=int, default=None, help="step limit per episode (default: the env's)")
    add_env_arg_option(ev)
    ev.add_argument(
        "--episode-timeout",
        type=float,
        default=None,
        help="seconds before an episode's worker is killed and the episode retried (default none)",
    )
    ev.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="episodes played side by side in each worker, their actions chosen together (one "
        "batched generation for an LLM agent; default 1)",
    )
    ev.add_argument("--no-progress", action="store_true", help="no progress bar")
    llm = ev.add_argument_group("LLM agents (hf:<model>, openai:<model>[@<base_url>])")
    llm.add_argument(
        "--template",
        default=None,
        help="prompt template: think-action (default), react, action, or a template JSON file",
    )
    llm.add_argument("--history", type=int, default=None, help="past turns shown in the prompt (default 2)")
    llm.add_argument(
        "--action-mode",
        choices=("generate", "choose"),
        default=None,
        help="hf: generate a response and parse its action (default), or choose: score the admissible actions",
    )
    llm.add_argument(
        "--choose-score",
        choices=("sum", "mean"),
        default=None,
        help="choose mode: a candidate's summed (default) or mean token log-probability",
    )
    llm.add_argument("--temperature", type=float, default=None, help="0 = greedy (default 0)")
    llm.add_argument("--top-p", type=float, default=None, help="nucleus sampling (default 1.0)")
    llm.add_argument("--max-new-tokens", type=int, default=None, help="response length limit (default 256)")
    llm.add_argument("--device", default=None, help="hf: cpu, cuda, cuda:1 or auto (default auto)")
    llm.add_argument("--dtype", default=None, help="hf: float32, bfloat16, float16 or auto (default auto)")
    llm.add_argument("--max-concurrency", type=int, default=None, help="openai: requests in flight (default 8)")
    llm.add_argument("--request-timeout", type=float, default=None, help="openai: seconds per request (default 60)")
    llm.add_argument("--max-retries", type=int, default=None, help="openai: retries per request (default 4)")


def _cmd_eval(args: argparse.Namespace) -> int:
    from envrl.evaluation.runner import EvaluationError, RunFailed, run_evaluation
    from envrl.evaluation.store import RunLocked, StoreError

    prog = "envrl eval"
    if args.episodes < 1:
        return _fail(prog, f"--episodes must be >= 1, got {args.episodes}")
    if args.workers < 1:
        return _fail(prog, f"--workers must be >= 1, got {args.workers}")
    if args.max_steps is not None and args.max_steps < 1:
        return _fail(prog, f"--max-steps must be >= 1, got {args.max_steps}")
    if args.ray is not None and not args.ray.strip():
        return _fail(prog, "--ray needs an address, 'auto' or 'local'")
    if args.episode_timeout is not None and args.episode_timeout <= 0:
        return _fail(prog, f"--episode-timeout must be > 0, got {args.episode_timeout}")
    if args.batch_size < 1:
        return _fail(prog, f"--batch-size must be >= 1, got {args.batch_size}")
    try:
        env_kwargs: dict[str, Any] = parse_env_args(args.env_arg)
    except ValueError as exc:
        return _fail(prog, str(exc))
    if args.max_steps is not None:
        env_kwargs["max_episode_steps"] = args.max_steps
    agent_options, problem = _agent_options(args)
    if problem:
        return _fail(prog, problem)
    try:
        summary = run_evaluation(
            args.env,
            args.split,
            args.agent,
            episodes=args.episodes,
            workers=args.workers,
            seed=args.seed,
            run_id=args.run_id,
            runs_dir=args.runs_dir,
            env_kwargs=env_kwargs,
            progress=not args.no_progress,
            episode_timeout=args.episode_timeout,
            ray_address=args.ray,
            agent_options=agent_options,
            batch_size=args.batch_size,
        )
    except EvaluationError as exc:
        return _fail(prog, str(exc))
    except (RunLocked, RunFailed, StoreError) as exc:
        return _fail(prog, str(exc), EXIT_FAILED)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    print(summary.format())
    return EXIT_OK


#: LLM flags: (flag, option name, agent kinds that take it)
_LLM_FLAGS = (
    ("--template", "template", ("hf", "openai")),
    ("--history", "history", ("hf", "openai")),
    ("--action-mode", "action_mode", ("hf",)),
    ("--choose-score", "choose_score", ("hf",)),
    ("--temperature", "temperature", ("hf", "openai")),
    ("--top-p", "top_p", ("hf", "openai")),
    ("--max-new-tokens", "max_new_tokens", ("hf", "openai")),
    ("--device", "device", ("hf",)),
    ("--dtype", "dtype", ("hf",)),
    ("--max-concurrency", "max_concurrency", ("openai",)),
    ("--request-timeout", "timeout", ("openai",)),
    ("--max-retries", "max_retries", ("openai",)),
)


def _agent_options(args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """The LLM flags that were given, as agent options; a flag the agent cannot use is an error."""
    kind = args.agent.split(":", 1)[0] if args.agent.startswith(("hf:", "openai:")) else None
    options: dict[str, Any] = {}
    for flag, name, kinds in _LLM_FLAGS:
        value = getattr(args, name if name != "timeout" else "request_timeout")
        if value is None:
            continue
        if kind not in kinds:
            return {}, f"{flag} applies to {' and '.join(k + ':' for k in kinds)} agents, not {args.agent!r}"
        options[name] = value
    return options, None


# ---- leaderboard and web page ------------------------------------------------------------


def _leaderboard_arguments(lb: argparse.ArgumentParser) -> None:
    lb.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    lb.add_argument("--runs", action="store_true", help="one row per run instead of one per agent")
    lb.add_argument("--runs-dir", default=None, help="results directory (default $ENVRL_RUNS_DIR or ./runs)")


def _serve_arguments(web: argparse.ArgumentParser) -> None:
    web.add_argument("--runs-dir", default=None, help="results directory (default $ENVRL_RUNS_DIR or ./runs)")
    web.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    web.add_argument("--port", type=port_argument, default=8050, help="port (default 8050; 0: any free port)")


def _serve_model_arguments(sm: argparse.ArgumentParser) -> None:
    sm.add_argument("checkpoint", help="a local checkpoint directory or a model name")
    sm.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sm.add_argument("--port", type=port_argument, default=8000, help="port (default 8000)")
    sm.add_argument("--model-name", default=None, help="the model id clients use (default: the checkpoint)")
    sm.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 or auto (default auto)")
    sm.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (default auto)")
    sm.add_argument("--max-batch-size", type=int, default=16, help="requests generated together (default 16)")


def _serve_env_arguments(se: argparse.ArgumentParser) -> None:
    """Every argument, options included, as it is: they are read by envrl.integrations.openenv
    (which imports openenv-core), so ``--help`` there lists them."""
    se.add_argument("args", nargs=argparse.REMAINDER)


def _cmd_leaderboard(args: argparse.Namespace) -> int:
    from envrl.evaluation.leaderboard import leaderboard
    from envrl.evaluation.store import StoreError

    try:
        text = leaderboard(args.runs_dir, args.format, runs=args.runs)
    except StoreError as exc:  # a runs directory that is a file, a corrupt or unreadable database
        return _fail("envrl leaderboard", str(exc), EXIT_FAILED)
    print(text)
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace) -> int:
    from envrl.evaluation.web import serve

    # says itself why it cannot read the store or bind the port (exit 1); 0 on a signal
    return serve(args.runs_dir, host=args.host, port=args.port)


def _cmd_serve_model(args: argparse.Namespace) -> int:
    prog = "envrl serve-model"
    if args.max_batch_size < 1:
        return _fail(prog, f"--max-batch-size must be >= 1, got {args.max_batch_size}")
    from envrl.agents.serve_model import serve

    # serve() reports a missing package, a busy port or an unloadable checkpoint itself (exit 1)
    return serve(
        args.checkpoint,
        host=args.host,
        port=args.port,
        model_name=args.model_name,
        device=args.device,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size,
    )


def _cmd_serve_env(args: argparse.Namespace) -> int:
    prog = "envrl serve-env"
    try:
        from envrl.integrations.openenv import main
    except ImportError as exc:  # openenv-core missing or of an untested version: the message names the extra
        return _fail(prog, str(exc), EXIT_FAILED)
    try:
        return main(args.args, prog=prog)
    except SystemExit as exc:  # its own argparse printed the usage or the help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


# ---- train -------------------------------------------------------------------------------


def _train_arguments(tr: argparse.ArgumentParser) -> None:
    tr.add_argument("--algo", required=True, help="a registered algorithm (listed below)")
    tr.add_argument("--env", required=True, help=f"a registered env: {_registered_envs()}")
    tr.add_argument("--model", default=None, help="checkpoint folder to start from (e.g. made by `envrl model init`)")
    tr.add_argument("--out", required=True, help="output folder: config, metrics.jsonl, checkpoints")
    tr.add_argument("--updates", type=int, default=None, help="optimizer updates (default: the config's)")
    tr.add_argument(
        "--data",
        default=None,
        help="sft: an `envrl data expert` folder or an expert's runs folder; iwm, sr: an "
        "`envrl data early-experience` folder",
    )
    tr.add_argument("--config", action="append", default=[], help="a YAML file of settings (repeatable)")
    tr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="one setting, e.g. optim.lr=1e-5")
    tr.add_argument("--seed", type=int, default=None)
    tr.add_argument(
        "--runs-dir", default=None, help="where evaluations are recorded (default $ENVRL_RUNS_DIR or ./runs)"
    )
    tr.add_argument("--stop-after", type=int, default=None, help="stop (and save) after this many updates in all")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar")


def _algorithms_epilog() -> str:
    """The ``--algo`` choices, read from the algorithm registry when ``envrl train --help`` is
    printed (it imports torch, which ``envrl --help`` and the other commands must not wait for)."""
    try:
        from envrl.training.algorithms import ALGORITHMS
    except ImportError as exc:
        return f"algorithms: listed once the train extra is installed: pip install 'envrl[train]' ({exc})"
    return f"algorithms: {', '.join(ALGORITHMS)}"


def _cmd_train(args: argparse.Namespace) -> int:
    prog = "envrl train"
    try:
        from envrl.training.algorithms import algorithm_class
        from envrl.training.config import ConfigError, build_config
    except ImportError as exc:
        return _fail(prog, f"training needs the train extra: pip install 'envrl[train]' ({exc})", EXIT_FAILED)
    overrides = {
        "policy.model": args.model,
        "out": args.out,
        "updates": args.updates,
        "seed": args.seed,
        "eval.runs_dir": args.runs_dir,
    }
    if args.data is not None:
        overrides["algorithm.data"] = args.data
    try:
        algorithm = algorithm_class(args.algo)
        config = build_config(
            args.algo,
            args.env,
            algorithm_config=algorithm.Config,
            files=args.config,
            overrides=overrides,
            sets=args.set,
        )
        from envrl.training.loop import Trainer

        trainer = Trainer(config)
    except (ConfigError, ValueError, OSError) as exc:
        return _fail(prog, " ".join(str(exc).split()))
    try:
        evaluations = trainer.run(stop_after=args.stop_after, progress=not args.no_progress)
    finally:
        trainer.close()
    for name, result in evaluations.items():
        print(f"{name}: success {100 * result['success_rate']:.1f}% over {result['episodes']} episodes")
    print(f"trained: {config.out} (metrics.jsonl, checkpoints/)")
    return EXIT_OK


# ---- webshop serve -----------------------------------------------------------------------


def _webshop_serve_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=port_argument, default=None, help="port (default $WEBSHOP_PORT, else 3000)")
    serve.add_argument("--workers", type=int, default=None, help="worker processes (default: one per CPU, at most 8)")
    serve.add_argument(
        "--products", type=int, default=None, help="catalog size (default: all of it; the built-in catalog has 1,000)"
    )
    serve.add_argument("--data-dir", default=None, help="official WebShop files (default $WEBSHOP_DATA, else built-in)")
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    serve.add_argument("--access-log", action="store_true", help="log every request to stderr")


def _cmd_webshop_serve(args: argparse.Namespace) -> int:
    from envrl.envs.webshop import server

    prog = "envrl webshop serve"
    try:
        options = server.ServeOptions(
            host=args.host,
            port=args.port if args.port is not None else server.default_port(),
            workers=args.workers if args.workers is not None else server.default_workers(),
            products=args.products,
            data_dir=args.data_dir,
            log_level=args.log_level,
            access_log=args.access_log,
        )
        options.check()
    except ValueError as exc:  # also a $WEBSHOP_PORT that is not a number
        return _fail(prog, str(exc))
    try:
        return server.serve(options)
    except KeyboardInterrupt:  # while the store was loading
        return EXIT_INTERRUPTED
    except (OSError, ValueError, RuntimeError) as exc:  # data missing or unreadable (WebShopDataError)
        return _fail(prog, " ".join(str(exc).split()) or type(exc).__name__, EXIT_FAILED)


# ---- the table of subcommands -------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One subcommand: ``path`` (``("data", "expert")`` is ``envrl data expert``), its one-line
    ``help``, the function that adds its arguments to its parser, and the handler that runs it
    (the parsed arguments in, the exit code out).

    ``description`` heads its ``--help``; ``epilog_from`` makes text that closes it, when it is
    printed (see :class:`_Parser`). ``raw_args``: the parser reads no option, ``--help``
    included, and hands every argument to the handler as it is (for a command whose options
    live in a module that needs an optional package).
    """

    path: tuple[str, ...]
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], object]
    handler: Callable[[argparse.Namespace], int]
    description: str | None = None
    epilog_from: Callable[[], str] | None = None
    raw_args: bool = False


@dataclass(frozen=True)
class Group:
    """A command that only holds subcommands (``envrl data``): its help line, and where the
    chosen subcommand's name is kept (``dest`` of the namespace; ``metavar`` in the usage)."""

    help: str
    dest: str
    metavar: str = "COMMAND"


#: the commands that hold subcommands, by path
GROUPS: Mapping[tuple[str, ...], Group] = {
    ("data",): Group("download official datasets; record expert demonstrations", "dataset", "DATASET"),
    ("model",): Group("make a from-scratch model and tokenizer for CPU experiments", "model_command"),
    ("webshop",): Group("the WebShop site", "webshop_command"),
}


def download_commands(registry: Mapping[str, EnvDescriptor] = REGISTRY) -> tuple[Command, ...]:
    """``envrl data <name>`` for each env whose descriptor names a ``downloader`` module, from its
    ``HELP``, ``add_arguments`` and ``run``: an env that ships official data adds the command in
    its own package. A module that lacks one of them is a ValueError naming it."""
    rows = []
    for name, descriptor in registry.items():
        if descriptor.downloader is None:
            continue
        module = importlib.import_module(descriptor.downloader)
        missing = [attr for attr in ("HELP", "add_arguments", "run") if not hasattr(module, attr)]
        if missing:
            raise ValueError(f"env {name!r}: downloader module {descriptor.downloader!r} lacks {', '.join(missing)}")
        rows.append(Command(("data", name), module.HELP, module.add_arguments, module.run))
    return tuple(rows)


#: every subcommand, in the order ``envrl --help`` lists them; a group is listed where its first subcommand is
COMMANDS: tuple[Command, ...] = (
    Command(
        ("eval",),
        "evaluate an agent on an env split (resumable)",
        _eval_arguments,
        _cmd_eval,
        description="Play N episodes and record them; re-running the same command resumes. "
        "Episode i plays task_ids[i mod len(task_ids)] with seed S + i.",
    ),
    Command(
        ("leaderboard",),
        "every agent's results per env and split (or every run)",
        _leaderboard_arguments,
        _cmd_leaderboard,
    ),
    Command(
        ("serve",),
        "the leaderboard, run pages and a trajectory viewer in the browser",
        _serve_arguments,
        _cmd_serve,
    ),
    Command(
        ("serve-model",),
        "an OpenAI-compatible server for a transformers checkpoint",
        _serve_model_arguments,
        _cmd_serve_model,
        description="Serve /v1/chat/completions for a transformers checkpoint (e.g. to evaluate "
        "it from another machine with --agent openai:<name>@http://host:port/v1).",
    ),
    Command(
        ("serve-env",),
        "serve an env over the OpenEnv protocol, one env per client (pip install 'envrl[openenv]')",
        _serve_env_arguments,
        _cmd_serve_env,
        raw_args=True,
    ),
    Command(
        ("train",),
        "train a policy with a registered algorithm (listed by its --help); resumable",
        _train_arguments,
        _cmd_train,
        description="Train a causal LM as an agent. Settings: the algorithm's YAML for the env, then --config, "
        "then the flags, then --set section.key=value. Re-running into the same --out resumes.",
        epilog_from=_algorithms_epilog,
    ),
    *download_commands(),
    Command(
        ("data", "expert"),
        "play an expert and save its (prompt, response) pairs for SFT (parquet)",
        Lazy("envrl.training.data:add_arguments"),
        Lazy("envrl.training.data:run"),
        description="Play N expert episodes and save the successful ones' steps as prompts and responses, built "
        "with the same template and history window as LLM agents use.",
    ),
    Command(
        ("data", "early-experience"),
        "execute K alternative actions from each expert state (Early Experience data, parquet)",
        Lazy("envrl.training.early_experience:add_arguments"),
        Lazy("envrl.training.early_experience:run"),
        description="From each state of an `envrl data expert` folder, execute K alternative actions (replaying the "
        "expert prefix in the deterministic env) and save (state, action, next state) rows beside the expert's.",
    ),
    Command(
        ("data", "rationales"),
        "write self-reflection (SR) rationales for an early-experience folder",
        Lazy("envrl.training.rationales:add_arguments"),
        Lazy("envrl.training.rationales:run"),
        description="For every alternative in DIR/rollout.parquet, write why the expert's action is better "
        "(contrast: a fixed sentence pattern stating both observed outcomes, not reasoning; openai:MODEL or "
        "hf:PATH: a model) to DIR/rationales.parquet.",
    ),
    Command(
        ("probe",),
        "how well a checkpoint predicts its env (state prediction, inverse dynamics); into the leaderboard",
        Lazy("envrl.training.probes:add_arguments"),
        Lazy("envrl.training.probes:run"),
        description="Play the env's expert on a split and measure, on its transitions, how well the checkpoint "
        "predicts the next observation (SP: teacher-forced token accuracy, exact match) and the action between "
        "two observations (ID: top-1 accuracy, with its chance level). The figures join the checkpoint's row in "
        "`envrl leaderboard` and `envrl serve`.",
    ),
    Command(
        ("model", "init"),
        "write a randomly initialised Qwen2 checkpoint with a tokenizer trained on env text",
        Lazy("envrl.training.scratch_model:add_arguments"),
        Lazy("envrl.training.scratch_model:run"),
        description="Write a randomly initialised Qwen2-architecture checkpoint and a byte-level BPE tokenizer "
        "trained on text the envs produce. No model hub is needed.",
    ),
    Command(
        ("webshop", "serve"),
        "serve the WebShop site (gunicorn) for envs with server_url=...",
        _webshop_serve_arguments,
        _cmd_webshop_serve,
        description="Serve the WebShop site under gunicorn until SIGTERM/SIGINT. The store is loaded once "
        "and shared by the workers; GET /healthz answers when it is up.",
    ),
)


def build_parser(
    commands: Sequence[Command] = COMMANDS, groups: Mapping[tuple[str, ...], Group] = GROUPS
) -> argparse.ArgumentParser:
    """The ``envrl`` parser: one subcommand per row of ``commands``, each under the groups its
    path names. A path under a group that ``groups`` lacks is a ValueError naming it; two rows
    with one path are argparse's error (conflicting subparser)."""
    parser = _Parser(prog="envrl", description="Text environments for LLM agents: evaluation and data.")
    subparsers: dict[tuple[str, ...], Any] = {(): _add_subparsers(parser, "command", "COMMAND")}
    for command in commands:
        for depth in range(1, len(command.path)):
            prefix = command.path[:depth]
            if prefix in subparsers:
                continue
            if prefix not in groups:
                raise ValueError(f"command {' '.join(command.path)!r}: no group {' '.join(prefix)!r} in GROUPS")
            group = groups[prefix]
            holder = subparsers[prefix[:-1]].add_parser(prefix[-1], help=group.help)
            subparsers[prefix] = _add_subparsers(holder, group.dest, group.metavar)
        raw: dict[str, Any] = {"add_help": False, "prefix_chars": "\0"} if command.raw_args else {}
        leaf = subparsers[command.path[:-1]].add_parser(
            command.path[-1],
            help=command.help,
            description=command.description,
            epilog_from=command.epilog_from,
            **raw,
        )
        command.add_arguments(leaf)
        leaf.set_defaults(handler=command.handler)
    return parser


def _add_subparsers(parser: argparse.ArgumentParser, dest: str, metavar: str) -> Any:
    """A required choice of subcommand, whose parsers report errors as :class:`_Parser` does."""
    sub = parser.add_subparsers(dest=dest, metavar=metavar, parser_class=_Parser)
    sub.required = True
    return sub


# ---- entry point -------------------------------------------------------------------------


class _StderrHandler(logging.StreamHandler):
    """Logs to whatever ``sys.stderr`` is when a record is written, not the one at set-up (a
    caller that swaps stderr, such as a test's capture, may close the old one)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``envrl`` command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    log = logging.getLogger("envrl")
    if not log.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("envrl: %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    except ValueError:  # not the main thread
        pass
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug or a case no handler foresaw: still one line, not a traceback
        return _unexpected(f"envrl {args.command}", exc)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _unexpected(prog: str, exc: Exception) -> int:
    """Report an exception no handler expected in one line (exit 1); ``ENVRL_TRACEBACK=1``
    prints the traceback too, for a bug report."""
    if os.environ.get("ENVRL_TRACEBACK", "").strip() not in ("", "0"):
        import traceback

        traceback.print_exc()
    text = " ".join(str(exc).split()) or repr(exc)
    return _fail(prog, f"unexpected {type(exc).__name__}: {text} (ENVRL_TRACEBACK=1 shows where)", EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
