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
import re
import threading
from typing import Any, Sequence

from envrl.envs.base import StepResult, TaskStart, TextEnv
from envrl.envs.webshop.page import OBSERVATION_MODES, Page, parse_page, render_observation
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

#: the most option combinations the expert scores exhaustively before choosing per option
MAX_OPTION_COMBINATIONS = 512

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
        self._transport = self._connect(server_url)
        self._page: Page | None = None
        self._visited: list[str] = []
        self._done = False
        self._goal_index = -1
        self._expert_options: dict[str, str] | None = None

    def _connect(self, server_url: str | None) -> Transport:
        if self.mode == "inprocess":
            return InProcessTransport(_site_for(self.store))
        if self.mode == "http":
            return HTTPTransport(server_url)
        if server_url is None:
            self._local_server = LocalServer(_site_for(self.store))
            server_url = self._local_server.url
        return BrowserTransport(server_url)

    # ---- TextEnv hooks -------------------------------------------------------------------

    def _split_task_ids(self) -> Sequence[str]:
        return self._task_ids

    def _task_index(self) -> frozenset[str]:
        return self._task_set

    def _start_task(self, task_id: str) -> TaskStart:
        self._goal_index = int(task_id.rsplit("_", 1)[1])
        goal = self.store.goals[self._goal_index]
        self._visited = []
        self._done = False
        self._expert_options = None
        self._show(self._transport.open(f"/{task_id}"))
        return TaskStart(observation=self._observation(), task_type=str(goal.get("category", "")),
                         instruction=self._page.instruction, admissible_actions=self._admissible(),
                         extra=self._extra())

    def _apply(self, action: str) -> StepResult:
        problem = self._problem_with(action)
        if problem is not None:
            return StepResult(observation=f"Invalid action: {problem}", reward=0.0, terminated=self._done,
                              valid_action=False, success=False, score=0.0,
                              admissible_actions=self._admissible(), extra=self._extra())
        verb, argument = self._parse(action)
        page = self._page
        if verb == "search":
            fetched = self._transport.search(page, argument)
        else:
            clickable = page.clickables[argument]
            if clickable.kind == "product":
                self._visited.append(argument)
            fetched = self._transport.click(page, clickable)
        self._show(fetched)
        if self._page.kind == "done":
            self._done = True
            reward = float(self._page.reward or 0.0)
            # The paper's formula counts every chosen option that matches, so a purchase with
            # more options than the goal names can exceed 1: the reward stays exact, the score
            # (in [0, 1] by contract) is clipped, and success is reaching 1.
            return StepResult(observation=self._observation(), reward=reward, terminated=True, valid_action=True,
                              success=reward >= 1.0, score=min(reward, 1.0), admissible_actions=[],
                              extra={**self._extra(), "reward_info": self._page.reward_info or {}})
        return StepResult(observation=self._observation(), reward=0.0, terminated=False, valid_action=True,
                          success=False, score=0.0, admissible_actions=self._admissible(), extra=self._extra())

    # ---- pages and actions -------------------------------------------------------------------

    def _show(self, fetched: Fetched) -> None:
        self._page = parse_page(fetched.html, fetched.url)

    def _observation(self) -> str:
        return render_observation(self._page, self.observation_mode, visited_asins=self._visited)

    @staticmethod
    def _parse(action: str) -> tuple[str, str]:
        match = ACTION_PATTERN.match(action)
        if match is None:
            return "", ""
        return match.group(1), match.group(2).strip().lower()

    def _problem_with(self, action: str) -> str | None:
        if self._done:
            return "the purchase is done; the episode is over (call reset())."
        verb, argument = self._parse(action)
        page = self._page
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
        page = self._page
        actions = ["search[<query>]"] if page.has_search_bar else []
        actions += [f"click[{text}]" for text in page.clickables if not (text == "search" and page.has_search_bar)]
        return actions

    def _extra(self) -> dict[str, Any]:
        page = self._page
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

        It searches the goal product's title, pages through the results to the product, picks
        the option combination that scores best against the goal, and buys. From any other
        page it goes back one step, so it recovers when an agent following it is sent astray.
        """
        page = self._page
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
        """The goal product's option choice with the highest reward (first such, in page order)."""
        if self._expert_options is None:
            goal = self.store.goals[self._goal_index]
            product = self.store.by_asin[goal["asin"]]
            groups = [(name, list(values)) for name, values in product.get("options", {}).items() if values]
            count = 1
            for _, values in groups:
                count *= len(values)
            if count <= MAX_OPTION_COMBINATIONS:
                candidates = [dict(zip([name for name, _ in groups], combo))
                              for combo in itertools.product(*[values for _, values in groups])]
            else:  # too many: choose each option on its own, the others left at their first value
                choice = {name: values[0] for name, values in groups}
                for name, values in groups:
                    choice[name] = max(values, key=lambda v: self.store.reward(
                        self._goal_index, goal["asin"], {**choice, name: v})[0])
                candidates = [choice]
            best, best_score = {}, -1.0
            for candidate in candidates:
                score = min(1.0, self.store.reward(self._goal_index, goal["asin"], candidate)[0])
                if score > best_score:
                    best, best_score = candidate, score
            self._expert_options = best
        return self._expert_options

    def close(self) -> None:
        transport, self._transport = getattr(self, "_transport", None), None
        if transport is not None:
            transport.close()
        server, self._local_server = getattr(self, "_local_server", None), None
        if server is not None:
            server.close()
        super().close()


__all__ = ["MODES", "WebShopConnectionError", "WebShopEnv"]
