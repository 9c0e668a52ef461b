"""``envrl/WebShop-v0``: shop on the WebShop site with ``search[...]`` and ``click[...]``.

One task is one goal of the store; its id is the site's session id ``fixed_<i>`` (goal
``i`` in the fixed goal order), so the same id means the same goal in-process, over HTTP
and in the browser. The episode starts on the search page and ends when the agent clicks
"Buy Now": the reward is the purchase score of the paper (``info["reward_info"]`` holds its
parts), success is a score of 1.0 (``info["score"]`` is clipped to 1; see ``_apply``). Anything else is a no-op with feedback, as in the
original, where invalid actions leave the page as it was.

The env reads every page the same way whatever the transport (``page.parse_page``), so an
action sequence gives the same ``text``/``text_rich`` observations in all three modes.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

from envrl.envs.base import StepResult, TaskStart, TextEnv
from envrl.envs.webshop.page import OBSERVATION_MODES, Page, parse_page, render_observation
from envrl.envs.webshop.reward import similarity
from envrl.envs.webshop.site import MAX_QUERY_CHARS
from envrl.envs.webshop.store import WebShopStore, load_store
from envrl.envs.webshop.transports import (
    BrowserTransport,
    Fetched,
    HTTPTransport,
    InProcessTransport,
    LocalServer,
    Transport,
    WebShopConnectionError,
)

MODES = ("inprocess", "http", "browser")

#: ``search[...]`` / ``click[...]``; the argument is matched case-insensitively, as the original does
ACTION_PATTERN = re.compile(r"^\s*(search|click)\[(.*)\]\s*$", re.DOTALL)

#: the most combinations of equally close option values the expert scores exhaustively to
#: break a tie, before it breaks the ties one option at a time
MAX_OPTION_COMBINATIONS = 512

#: a goal option given without its name (official human goals are plain lists of values) goes
#: only to an option group with a value at least this similar (``reward.similarity``, 0..100).
#: Spelling variants pass ("grey"/"gray" 75, "octagonal"/"octagon" 88); below it lie chance
#: resemblances ("hexagon"/"octagon" 57), and clicking one would demonstrate a guess
UNNAMED_MATCH_FLOOR = 70

_APPS: dict[int, Any] = {}
_APPS_LOCK = threading.Lock()


def _site_for(store: WebShopStore) -> Any:
    """One Flask app per store per process (the app is stateless, so sharing it is safe)."""
    from envrl.envs.webshop.site import create_app

    with _APPS_LOCK:
        if id(store) not in _APPS:
            _APPS[id(store)] = create_app(store)
        return _APPS[id(store)]


class WebShopEnv(TextEnv):
    """WebShop as a Gymnasium env (text observations, text actions)."""

    def __init__(
        self,
        split: str = "train",
        observation_mode: str = "text",
        mode: str | None = None,
        server_url: str | None = None,
        num_products: int | None = None,
        data_dir: str | None = None,
        expert_plan: bool = False,
        render_mode: str | None = None,
    ):
        """
        Args:
            split: ``train``, ``eval``, ``test`` or ``test_ood`` (see ``goals.py``).
            observation_mode: ``text`` (the original's ``[SEP]``-joined page text), ``text_rich``
                (``[button] ... [button_]`` markers) or ``html`` (the page as served).
            mode: ``inprocess`` (default), ``http`` (default when ``server_url`` is given) or
                ``browser`` (headless Chromium; starts a local server if ``server_url`` is None).
            server_url: a running ``envrl webshop serve`` or container, e.g. ``http://127.0.0.1:3000``.
                The goals and splits are still read locally, so the client must use the same
                data as the server (the built-in catalog is identical everywhere).
            num_products, data_dir: which catalog (see ``store.load_store``).
            expert_plan: add ``info["expert_plan"]``, the oracle's remaining actions from this page.
        """
        super().__init__(split, render_mode)
        if observation_mode not in OBSERVATION_MODES:
            raise ValueError(f"observation_mode must be one of {OBSERVATION_MODES}, got {observation_mode!r}")
        mode = mode or ("http" if server_url else "inprocess")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "http" and not server_url:
            raise ValueError("mode='http' needs server_url='http://host:port'")
        if mode == "inprocess" and server_url:
            raise ValueError("server_url is for mode='http' or 'browser', not 'inprocess'")
        self.observation_mode = observation_mode
        self.mode = mode
        self.expert_plan = expert_plan
        self.store = load_store(num_products=num_products, data_dir=data_dir)
        # split_goals raises a ValueError naming the splits if ``split`` is unknown
        self._task_ids = [f"fixed_{i}" for i in self.store.split_goals(split)]
        self._task_set = frozenset(self._task_ids)
        self._local_server: LocalServer | None = None
        # None once closed (unset if _connect raised; _close_engine copes with both)
        self._transport: Transport | None = self._connect(server_url)
        self._page: Page | None = None
        self._visited: list[str] = []
        self._goal_index = -1
        self._expert_options: dict[str, str] | None = None

    def _connect(self, server_url: str | None) -> Transport:
        if self.mode == "inprocess":
            return InProcessTransport(_site_for(self.store))
        if self.mode == "http":
            if server_url is None:  # __init__ already refused this; narrows the type
                raise ValueError("mode='http' needs server_url='http://host:port'")
            return HTTPTransport(server_url)
        if server_url is None:
            self._local_server = LocalServer(_site_for(self.store))
            server_url = self._local_server.url
        return BrowserTransport(server_url)

    @property
    def page(self) -> Page:
        """The page the agent is on; there is none before the first :meth:`reset`."""
        if self._page is None:
            raise gym.error.ResetNeeded("Call reset() before reading the page.")
        return self._page

    def _live_transport(self) -> Transport:
        """The open transport (reset/step check that the env is open before reaching here)."""
        if self._transport is None:
            raise gym.error.ClosedEnvironmentError(f"{type(self).__name__} was closed; make a new env to play again")
        return self._transport

    # ---- TextEnv hooks -------------------------------------------------------------------

    def _split_task_ids(self) -> Sequence[str]:
        return self._task_ids

    def _task_index(self) -> frozenset[str]:
        return self._task_set

    def _start_task(self, task_id: str) -> TaskStart:
        self._goal_index = int(task_id.rsplit("_", 1)[1])
        goal = self.store.goals[self._goal_index]
        self._visited = []
        self._expert_options = None
        self._show(self._live_transport().open(f"/{task_id}"))
        return TaskStart(
            observation=self._observation(),
            task_type=str(goal.get("category", "")),
            instruction=self.page.instruction,
            admissible_actions=self._admissible(),
            extra=self._extra(),
        )

    def _apply(self, action: str) -> StepResult:
        problem = self._problem_with(action)
        if problem is not None:
            return StepResult(
                observation=f"Invalid action: {problem}",
                reward=0.0,
                terminated=False,
                valid_action=False,
                success=False,
                score=0.0,
                admissible_actions=self._admissible(),
                extra=self._extra(),
            )
        verb, argument = self._parse(action)
        page, transport = self.page, self._live_transport()
        if verb == "search":
            fetched = transport.search(page, argument)
        else:
            clickable = page.clickables[argument]
            if clickable.kind == "product":
                self._visited.append(argument)
            fetched = transport.click(page, clickable)
        self._show(fetched)
        page = self.page
        if page.kind == "done":
            reward = float(page.reward or 0.0)
            # The paper's formula counts every chosen option that matches, so a purchase with
            # more options than the goal names can exceed 1: the reward stays exact, the score
            # (in [0, 1] by contract) is clipped, and success is reaching 1.
            return StepResult(
                observation=self._observation(),
                reward=reward,
                terminated=True,
                valid_action=True,
                success=reward >= 1.0,
                score=min(reward, 1.0),
                admissible_actions=[],
                extra={**self._extra(), "reward_info": page.reward_info or {}},
            )
        return StepResult(
            observation=self._observation(),
            reward=0.0,
            terminated=False,
            valid_action=True,
            success=False,
            score=0.0,
            admissible_actions=self._admissible(),
            extra=self._extra(),
        )

    # ---- pages and actions -------------------------------------------------------------------

    def _show(self, fetched: Fetched) -> None:
        self._page = parse_page(fetched.html, fetched.url)

    def _observation(self) -> str:
        return render_observation(self.page, self.observation_mode, visited_asins=self._visited)

    @staticmethod
    def _parse(action: str) -> tuple[str, str]:
        match = ACTION_PATTERN.match(action)
        if match is None:
            return "", ""
        return match.group(1), match.group(2).strip().lower()

    def _problem_with(self, action: str) -> str | None:
        verb, argument = self._parse(action)
        page = self.page
        if verb == "search":
            if not page.has_search_bar:
                return "there is no search bar on this page (click[back to search] first)."
            if not argument:
                return "search[...] needs keywords."
            if len(argument) > MAX_QUERY_CHARS:
                return f"the search query is longer than {MAX_QUERY_CHARS} characters."
            if "\ufffd" in argument:
                return "the search query holds an undecodable character (U+FFFD)."
            return None
        if verb == "click":
            if argument == "search" and page.has_search_bar:
                return "to search, write search[your keywords]."
            if argument not in page.clickables:
                return f"{argument!r} is not clickable on this page."
            return None
        return "write search[keywords] or click[an item on the page]."

    def _admissible(self) -> list[str]:
        page = self.page
        actions = ["search[<query>]"] if page.has_search_bar else []
        actions += [f"click[{text}]" for text in page.clickables if not (text == "search" and page.has_search_bar)]
        return actions

    def _extra(self) -> dict[str, Any]:
        page = self.page
        extra: dict[str, Any] = {
            "url": page.url,
            "page": page.kind,
            "has_search_bar": page.has_search_bar,
            "clickables": list(page.clickables),
        }
        if self.expert_plan:
            extra["expert_plan"] = self._expert_actions()
        return extra

    # ---- the oracle -----------------------------------------------------------------------

    def _expert_actions(self) -> list[str]:
        """The oracle's remaining actions from the current page.

        It searches the goal product's title, pages through the results to the product, clicks
        the goal's own option values (:meth:`_best_options`), and buys. From any other
        page it goes back one step, so it recovers when an agent following it is sent astray.
        """
        page = self.page
        goal = self.store.goals[self._goal_index]
        asin = str(goal["asin"])
        options = self._best_options()
        buy = [f"click[{value}]" for value in options.values()] + ["click[buy now]"]
        if page.kind == "done":
            return []
        if page.kind == "search":
            return [f"search[{self.store.by_asin[asin]['Title'].lower()}]", f"click[{asin.lower()}]", *buy]
        if page.kind == "results":
            if asin.lower() in page.clickables:
                return [f"click[{asin.lower()}]", *buy]
            if "next >" in page.clickables:
                return ["click[next >]"]
            return ["click[back to search]"]
        if page.kind == "item" and (page.asin or "").upper() == asin.upper():
            chosen = page.options
            todo = [value for name, value in options.items() if chosen.get(name) != value]
            return [f"click[{value}]" for value in todo] + ["click[buy now]"]
        return ["click[< prev]"] if "< prev" in page.clickables else ["click[back to search]"]

    def _best_options(self) -> dict[str, str]:
        """The options the oracle clicks on the goal product: the goal's own values.

        Its episodes become demonstrations, so it must show what the instruction asks, not
        whatever the reward also accepts (the reward counts any chosen option found in the
        product's text). The score only breaks ties; see :func:`choose_goal_options`.
        """
        if self._expert_options is None:
            goal_index = self._goal_index
            goal = self.store.goals[goal_index]
            asin = str(goal["asin"])

            def score(chosen: dict[str, str]) -> float:
                return min(1.0, self.store.reward(goal_index, asin, chosen)[0])

            self._expert_options = choose_goal_options(
                self.store.by_asin[asin].get("options") or {}, goal["goal_options"], score
            )
        return self._expert_options

    def _close_engine(self) -> None:
        transport, self._transport = getattr(self, "_transport", None), None
        if transport is not None:
            transport.close()
        server, self._local_server = getattr(self, "_local_server", None), None
        if server is not None:
            server.close()


# ---- the oracle's option choice ---------------------------------------------------------------


def _plain(value: str) -> str:
    """Case and spacing folded, so that "Black  | Clear Glass" is the value "black | clear glass"."""
    return " ".join(str(value).casefold().split())


def option_closeness(wanted: str, offered: str) -> tuple[int, int, int]:
    """How close an offered option value is to a wanted one (tuples compare, larger is closer).

    Equality (case and spacing folded) beats everything. Then the reward's own similarity, so
    that the expert prefers a value the paper's reward counts as the goal's. Then plain edit
    similarity, which tells "large" from "x-large" where token-set similarity rates both 100.
    """
    a, b = _plain(wanted), _plain(offered)
    return int(a == b), similarity(a, b), int(round(fuzz.ratio(a, b, processor=default_process)))


def _goal_wants(goal_options: Mapping[str, str] | Sequence[str]) -> list[tuple[str | None, str]]:
    """``(option name or None, value)`` per goal option: synthetic goals name their options,
    human goals are a plain list of values."""
    if isinstance(goal_options, Mapping):
        return [(str(name), str(value)) for name, value in goal_options.items()]
    return [(None, str(value)) for value in goal_options]


@dataclass(frozen=True)
class _Placement:
    """A goal option put in one option group, with that group's closest values (ties kept)."""

    closeness: tuple[int, int, int]
    goal_position: int
    group: str
    values: tuple[str, ...]


def _placements(wants: list[tuple[str | None, str]], groups: Mapping[str, list[str]]) -> list[_Placement]:
    """Every group each goal option may go to: the group of its name, or, for a goal option
    without a name the product knows, any group with a value past ``UNNAMED_MATCH_FLOOR``."""
    by_name = {_plain(name): name for name in groups}
    out = []
    for position, (name, value) in enumerate(wants):
        anchor = by_name.get(_plain(name)) if name is not None else None
        for group in [anchor] if anchor is not None else list(groups):
            scored = [(option_closeness(value, offered), offered) for offered in groups[group]]
            best = max(closeness for closeness, _ in scored)
            if anchor is None and not best[0] and best[1] < UNNAMED_MATCH_FLOOR:
                continue
            out.append(_Placement(best, position, group, tuple(o for c, o in scored if c == best)))
    return out


def _assign(placements: list[_Placement]) -> dict[str, tuple[str, ...]]:
    """Group -> its tied closest values; each goal option and each group used once, closest
    pairs first (so an exact match is never displaced by a fuzzy one), then goal order."""
    ranked = sorted(placements, key=lambda p: (p.closeness, -p.goal_position), reverse=True)
    used: set[int] = set()
    chosen: dict[str, tuple[str, ...]] = {}
    for placement in ranked:
        if placement.goal_position not in used and placement.group not in chosen:
            used.add(placement.goal_position)
            chosen[placement.group] = placement.values
    return chosen


def _break_ties(ties: list[tuple[str, tuple[str, ...]]], score: Callable[[dict[str, str]], float]) -> dict[str, str]:
    """One value per group among its tied ones: the combination with the best score, the first
    in page order on equal scores (one group at a time beyond ``MAX_OPTION_COMBINATIONS``)."""
    names = [name for name, _ in ties]
    count = math.prod(len(values) for _, values in ties)
    if count == 1:  # no tie: nothing to score (the usual case)
        return {name: values[0] for name, values in ties}
    if count <= MAX_OPTION_COMBINATIONS:
        combos = itertools.product(*[values for _, values in ties])
        return dict(zip(names, max(combos, key=lambda combo: score(dict(zip(names, combo))))))
    choice = {name: values[0] for name, values in ties}
    for name, values in ties:
        choice[name] = max(values, key=lambda value: score({**choice, name: value}))
    return choice


def choose_goal_options(
    groups: Mapping[str, Sequence[str]],
    goal_options: Mapping[str, str] | Sequence[str],
    score: Callable[[dict[str, str]], float],
) -> dict[str, str]:
    """The option values to click for a goal, in the product's (page) order.

    Each goal option gets its own value where the product offers it (case and spacing aside),
    else the closest value (:func:`option_closeness`) in the group of its name, or, when the goal
    gives no name, in the group where it is closest. Groups the goal does not ask about are left
    alone. ``score(chosen)`` only breaks ties between equally close values.
    """
    offered = {name: [str(v) for v in values] for name, values in groups.items() if values}
    ties = _assign(_placements(_goal_wants(goal_options), offered))
    return _break_ties([(name, ties[name]) for name in offered if name in ties], score)


__all__ = ["MODES", "WebShopConnectionError", "WebShopEnv"]
