"""``WebShopStore``: the catalog, goals, search and reward that the site and the env share.

:func:`load_store` builds one store per set of arguments and process and hands the same object
to every caller (threads included), because loading is the slow part: about 0.2 s for the
1,000-product built-in catalog, seconds for 100,000 products (cached on disk).

Sources. ``data_dir`` (or ``$WEBSHOP_DATA`` when ``data_dir`` is None) -> the official files
with human goals when ``items_human_ins.json`` is there (:mod:`.catalog`); neither -> the
built-in catalog of ``num_products`` products (default 1,000) with synthetic goals.
``source`` says which, so official and built-in tasks never mix silently.

Sessions. Goal ``i`` is the site's session ``fixed_<i>``. Any other session id gets a train
goal drawn by the goals' weights (as the original draws a goal for a new session) with a
``random.Random`` seeded from the SHA-256 of the id, so the same id gets the same goal in every
process.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import threading
from pathlib import Path

from envrl.envs.webshop import builtin, catalog
from envrl.envs.webshop import goals as goals_mod
from envrl.envs.webshop import reward as reward_mod
from envrl.envs.webshop.goals import SPLITS
from envrl.envs.webshop.search import SEARCH_RETURN_N, SearchIndex

_FIXED = re.compile(r"fixed_(\d+)")


class WebShopStore:
    """Products (engine schema, catalog order), seeded prices, goals in the original's order,
    their splits, BM25 search and the paper's reward."""

    products: list[dict]
    by_asin: dict[str, dict]
    prices: dict[str, float]
    goals: list[dict]
    source: str

    def __init__(self, cat: catalog.Catalog, goals: list[dict], index: SearchIndex):
        self.products = cat.products
        self.by_asin = cat.by_asin
        self.prices = cat.prices
        self.goals = goals
        self.source = cat.source
        self.human_goals = cat.human_goals
        self.files = cat.files
        self._index = index
        self._held_out = goals_mod.held_out_categories(goals)
        self._splits = goals_mod.split_indices(goals, self._held_out)
        self._train_weights = [goals[i]["weight"] for i in self._splits["train"]]

    def __repr__(self) -> str:
        return (
            f"WebShopStore(source={self.source!r}, products={len(self.products)}, "
            f"goals={len(self.goals)}, human_goals={self.human_goals})"
        )

    def split_goals(self, split: str) -> list[int]:
        """Goal indices of ``split`` (one of ``SPLITS``), in order."""
        if split not in self._splits:
            raise ValueError(f"unknown WebShop split {split!r}; expected one of {', '.join(SPLITS)}")
        return list(self._splits[split])

    def held_out_categories(self) -> frozenset[str]:
        """The product categories of ``test_ood`` (never the category of a train goal)."""
        return self._held_out

    def search(self, query: str) -> list[dict]:
        """Up to 50 products for a free-text query, best first."""
        return [self.by_asin[a] for a in self._index.search(query, SEARCH_RETURN_N)]

    def search_asins(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        return self._index.search(query, k)

    def reward(self, goal_index: int, asin: str, options: dict[str, str]) -> tuple[float, dict]:
        """The paper's reward for buying ``asin`` with ``options`` for goal ``goal_index``,
        with the original's verbose info (r_type, r_att, w_att, ...)."""
        if not 0 <= goal_index < len(self.goals):
            raise IndexError(f"goal index {goal_index} out of range 0..{len(self.goals) - 1}")
        product = self.by_asin[asin]
        return reward_mod.get_reward(product, self.goals[goal_index], self.prices[asin], options)

    def goal_for_session(self, session_id: str) -> int:
        """``fixed_<i>`` -> ``i``; any other id -> a train goal picked by weight, stably per id."""
        session_id = str(session_id)
        if session_id.startswith("fixed_"):
            match = _FIXED.fullmatch(session_id)
            if match is None or int(match.group(1)) >= len(self.goals):
                raise ValueError(f"session {session_id!r}: expected fixed_<i> with 0 <= i < {len(self.goals)}")
            return int(match.group(1))
        pool = self._splits["train"] or list(range(len(self.goals)))
        weights = self._train_weights if self._splits["train"] else [g["weight"] for g in self.goals]
        seed = int.from_bytes(hashlib.sha256(session_id.encode("utf-8")).digest()[:8], "big")
        return random.Random(seed).choices(pool, weights=weights)[0]


_lock = threading.Lock()
_stores: dict[tuple, WebShopStore] = {}
_key_locks: dict[tuple, threading.Lock] = {}


def _resolve(num_products: int | None, data_dir: str | os.PathLike | None) -> tuple:
    if data_dir is None and os.environ.get("WEBSHOP_DATA"):
        data_dir = os.environ["WEBSHOP_DATA"]
    if data_dir is not None:
        return ("official", str(Path(data_dir).expanduser().resolve()), num_products)
    return ("builtin", None, builtin.DEFAULT_NUM_PRODUCTS if num_products is None else int(num_products))


def build_store(num_products: int | None = None, data_dir: str | os.PathLike | None = None) -> WebShopStore:
    """A new store (no per-process cache); :func:`load_store` is what callers want."""
    return _build(_resolve(num_products, data_dir))


def _build(key: tuple) -> WebShopStore:
    source, folder, n = key
    if source == "official":
        cat = catalog.load_official(folder, n)
        cap = None
    else:
        cat = catalog.load_builtin_catalog(n)
        cap = goals_mod.BUILTIN_MAX_GOALS_PER_PRODUCT
    with catalog.no_gc():
        goal_list = goals_mod.build_goals(cat.products, cat.prices, human=cat.human_goals, max_per_product=cap)
    if not goal_list:
        raise catalog.WebShopDataError(
            f"the WebShop catalog ({cat.source}, {len(cat.products)} products) yields no goals: "
            "no product has an instruction with attributes"
        )
    index = SearchIndex.build(cat.products)
    return WebShopStore(cat, goal_list, index)


def load_store(num_products: int | None = None, data_dir: str | os.PathLike | None = None) -> WebShopStore:
    """The process-wide store for these arguments (built once; thread-safe).

    ``data_dir`` None -> ``$WEBSHOP_DATA`` if set (official files), else the built-in catalog of
    ``num_products`` products (default 1,000). For official data ``num_products`` keeps the
    first ``num_products`` records, as the original, and above 1,000 selects the full files.
    """
    key = _resolve(num_products, data_dir)
    with _lock:
        store = _stores.get(key)
        if store is not None:
            return store
        key_lock = _key_locks.setdefault(key, threading.Lock())
    with key_lock:  # one build per key; other keys build in parallel
        with _lock:
            store = _stores.get(key)
        if store is None:
            store = _build(key)
            with _lock:
                _stores[key] = store
    return store
