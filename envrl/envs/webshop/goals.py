"""WebShop goals, built as the original engine builds them, in its fixed order, and the splits.

Goals (the original's ``get_human_goals`` / ``get_synthetic_goals``):

* human (the official setting of the papers, used whenever ``items_human_ins.json`` was
  loaded): one goal per human instruction with at least one ``instruction_attributes`` entry,
  in catalog order; ``goal_options`` = the instruction's ``instruction_options`` (a list);
  ``instruction_text`` = the instruction without its surrounding dots + the price clause;
  ``weight`` 1.
* synthetic (the built-in catalog, or official data without the human file): one goal per
  combination of the product's option values (option names sorted), ``goal_options`` a
  name -> value dict, ``instruction_text`` = the product's instruction + ``" with color: x, and
  size: y"`` + the price clause, ``weight`` = the mean over the goal's attributes of 1 / (how
  many goals name that attribute). For the built-in catalog the combinations of a product are
  capped at ``BUILTIN_MAX_GOALS_PER_PRODUCT`` = 6, evenly spaced from a seeded random
  start and kept in ``itertools.product`` order: 1,000 products give about 3,000 goals (about 700 products have an
  instruction; most have 4-25 combinations) instead of one product with 25 sizes-by-colours
  dominating. Official synthetic goals are not capped, as in the original.

Price bound: with ``r`` the first four multiples of 10 above the product's price
(``PRICE_RANGE``), ``price_upper`` = the larger of two values sampled from ``r`` and the text
gets ``", and price lower than {price_upper:.2f} dollars"``; with fewer than two such values
``price_upper`` = 1,000,000 and no clause. The original samples with the global unseeded RNG;
here one ``random.Random(PRICE_UPPER_SEED)`` walks the products in catalog order.

Order: ``random.Random(233).shuffle(goals)``, which is the original's ``random.seed(233);
random.shuffle(goals)``, so goal ``i`` is what the original calls session ``fixed_<i>``
(tests/test_webshop_data.py checks this against the official ``human_goals.json``).

Splits, by goal index: ``test`` = 0-499, ``eval`` = 500-1499 (the original's), ``train`` =
1500.. except the held-out categories, ``test_ood`` = goals from 1500 on whose
``product_category`` is held out. With fewer than 3,000 goals the two bounds shrink to n/6 and
n/2. Held-out product categories (:func:`held_out_categories`) are chosen among the goals from
1500 on, separately for each top-level ``category``: its product categories are taken in the
order of the SHA-256 of their path, skipping any that would bring the held-out share of that
category's goals above 25%, until the share reaches 5%. In the built-in catalog (six leaf
categories of ~17% each per top-level category) that is exactly one leaf per top-level
category. The rule depends only on the goals, so it is the same on every machine.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from envrl.envs.webshop.reward import PRICE_RANGE

SPLITS = ("train", "eval", "test", "test_ood")
GOAL_SHUFFLE_SEED = 233
PRICE_UPPER_SEED = "envrl-webshop-price-upper-v1"
COMBINATION_SEED = "envrl-webshop-goal-combinations-v1"
BUILTIN_MAX_GOALS_PER_PRODUCT = 6
TEST_END, EVAL_END = 500, 1500
NO_PRICE_BOUND = 1000000
OOD_MIN_SHARE, OOD_MAX_SHARE = 0.05, 0.25


def _price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        return NO_PRICE_BOUND, ""
    _, upper = sorted(rng.sample(above, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def human_goals(products: Sequence[Mapping[str, Any]], prices: Mapping[str, float]) -> list[dict]:
    """Goals from the human instructions, in catalog order (before the shuffle)."""
    rng = random.Random(PRICE_UPPER_SEED)
    goals: list[dict] = []
    for product in products:
        for instruction in product.get("instructions") or ():
            attributes = instruction["instruction_attributes"]
            if not attributes:
                continue
            upper, price_text = _price_bound(prices[product["asin"]], rng)
            goals.append(
                {
                    "asin": product["asin"],
                    "category": product["category"],
                    "query": product["query"],
                    "name": product["name"],
                    "product_category": product["product_category"],
                    "instruction_text": instruction["instruction"].strip(".") + price_text,
                    "attributes": attributes,
                    "price_upper": upper,
                    "goal_options": instruction["instruction_options"],
                    "weight": 1,
                }
            )
    return goals


def _combinations(options: Mapping[str, Sequence[str]], cap: int | None, rng: random.Random) -> list[tuple[str, ...]]:
    """Option-value combinations (names sorted), all of them or ``cap`` in product order.

    With a cap, the kept combinations are ``cap`` evenly spaced ``itertools.product`` indices
    from a random start (one draw per product, cheap at 100,000 products).
    """
    names = sorted(options)
    pools = [options[n] for n in names]
    total = 1
    for pool in pools:
        total *= len(pool)
    if cap is None or total <= cap:
        return list(itertools.product(*pools))
    start = int(rng.random() * total)
    chosen = sorted({(start + (j * total) // cap) % total for j in range(cap)})
    out = []
    for index in chosen:  # mixed-radix decoding of the itertools.product index
        combo = []
        for pool in reversed(pools):
            index, r = divmod(index, len(pool))
            combo.append(pool[r])
        out.append(tuple(reversed(combo)))
    return out


def synthetic_goals(
    products: Sequence[Mapping[str, Any]], prices: Mapping[str, float], max_per_product: int | None = None
) -> list[dict]:
    """Goals from the products' synthetic instructions, one per option combination."""
    price_rng = random.Random(PRICE_UPPER_SEED)
    combo_rng = random.Random(COMBINATION_SEED)
    goals: list[dict] = []
    attribute_counts: dict[str, int] = defaultdict(int)
    for product in products:
        instruction = product.get("instruction_text")
        attributes = product.get("instruction_attributes")
        if instruction is None or not attributes:
            continue
        upper, price_text = _price_bound(prices[product["asin"]], price_rng)
        names = sorted(product["options"])
        for combo in _combinations(product["options"], max_per_product, combo_rng):
            goal_options = dict(zip(names, combo))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = f" with {option_text}" if option_text else ""
            goals.append(
                {
                    "asin": product["asin"],
                    "category": product["category"],
                    "query": product["query"],
                    "name": product["Title"],
                    "product_category": product["product_category"],
                    "instruction_text": f"{instruction}{option_text}{price_text}",
                    "attributes": attributes,
                    "price_upper": upper,
                    "goal_options": goal_options,
                }
            )
            for attribute in attributes:
                attribute_counts[attribute] += 1
    for goal in goals:
        goal["weight"] = sum(1.0 / attribute_counts[a] for a in goal["attributes"]) / len(goal["attributes"])
    return goals


def build_goals(
    products: Sequence[Mapping[str, Any]],
    prices: Mapping[str, float],
    *,
    human: bool,
    max_per_product: int | None = None,
) -> list[dict]:
    """All goals in the original's fixed (shuffled) order."""
    goals = human_goals(products, prices) if human else synthetic_goals(products, prices, max_per_product)
    return shuffle_goals(goals)


def shuffle_goals(goals: list) -> list:
    """The original's fixed order: ``random.seed(233); random.shuffle(goals)`` (in place)."""
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return goals


# --------------------------------------------------------------------------- splits


def split_bounds(n_goals: int) -> tuple[int, int]:
    """``(test_end, eval_end)``: 500 and 1500, or n/6 and n/2 below 3,000 goals."""
    if n_goals >= 2 * EVAL_END:
        return TEST_END, EVAL_END
    return n_goals // 6, n_goals // 2


def _path_key(path: str) -> str:
    return hashlib.sha256(path.encode("utf-8")).hexdigest()


def held_out_categories(goals: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """The ``product_category`` paths whose goals form ``test_ood`` (see the module docstring)."""
    _, eval_end = split_bounds(len(goals))
    pairs = Counter((g["category"], g["product_category"]) for g in goals[eval_end:])
    per_category: dict[str, dict[str, int]] = defaultdict(dict)
    for (category, path), count in pairs.items():
        if path:
            per_category[category][path] = count
    held: set[str] = set()
    for category in sorted(per_category):
        counts = per_category[category]
        total = sum(counts.values())
        taken = 0
        for path in sorted(counts, key=_path_key):
            if taken >= OOD_MIN_SHARE * total:
                break
            if taken + counts[path] <= OOD_MAX_SHARE * total:
                held.add(path)
                taken += counts[path]
    return frozenset(held)


def split_indices(goals: Sequence[Mapping[str, Any]], held: frozenset[str] | None = None) -> dict[str, list[int]]:
    """Goal indices of every split in ``SPLITS``; disjoint, together all goals."""
    test_end, eval_end = split_bounds(len(goals))
    if held is None:
        held = held_out_categories(goals)
    in_ood = [g["product_category"] in held for g in goals[eval_end:]]
    train = [eval_end + i for i, ood in enumerate(in_ood) if not ood]
    ood = [eval_end + i for i, ood in enumerate(in_ood) if ood]
    return {"train": train, "eval": list(range(test_end, eval_end)), "test": list(range(test_end)), "test_ood": ood}
