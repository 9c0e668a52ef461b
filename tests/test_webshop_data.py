"""WebShop data layer: official formats, the built-in catalog, goals, splits, search, store."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, SHARED_WEBSHOP, require_shared_data

from envrl.envs.webshop import builtin, catalog
from envrl.envs.webshop import goals as G
from envrl.envs.webshop import search as S
from envrl.envs.webshop import store as ST
from envrl.envs.webshop.catalog import WebShopDataError
from envrl.envs.webshop.reward import PRICE_RANGE, get_reward

SAMPLE_PRODUCTS = SHARED_WEBSHOP / "samples" / "items_shuffle_1000.first4products.json"
SAMPLE_HUMAN = SHARED_WEBSHOP / "samples" / "items_human_ins.first31asins.json"
ATTRIBUTES_1000 = SHARED_WEBSHOP / "items_ins_v2_1000.json"


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path_factory):
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    monkeypatch.setenv("ENVRL_WEBSHOP_NOUNS", "approx")
    monkeypatch.setenv("ENVRL_CACHE", str(tmp_path_factory.getbasetemp() / "envrl-cache"))


@pytest.fixture(scope="module")
def official() -> Path:
    require_shared_data(SAMPLE_PRODUCTS, ATTRIBUTES_1000)
    return SHARED_WEBSHOP


@pytest.fixture(scope="module")
def store1k() -> ST.WebShopStore:
    os.environ.pop("WEBSHOP_DATA", None)
    return ST.load_store()


def _official_dir(tmp_path: Path, human: dict | None = None) -> Path:
    folder = tmp_path / "webshop"
    folder.mkdir(parents=True)
    (folder / "items_shuffle_1000.json").symlink_to(SAMPLE_PRODUCTS)
    (folder / "items_ins_v2_1000.json").symlink_to(ATTRIBUTES_1000)
    if human is not None:
        (folder / "items_human_ins.json").write_text(json.dumps(human))
    return folder


# --------------------------------------------------------------------------- official formats


def test_official_sample_records_parse_into_engine_schema(official):
    raw = json.loads(SAMPLE_PRODUCTS.read_text())
    attributes = json.loads(ATTRIBUTES_1000.read_text())
    products = catalog.build_products(raw, attributes)
    by_asin = {p["asin"]: p for p in products}
    assert list(by_asin) == ["B06Y3VLDFB", "B08R3XSC65", "B09DG92LJL", "B07B6DVG41"]

    table = by_asin["B06Y3VLDFB"]
    assert table["Title"] == table["name"] == raw[0]["name"]
    assert table["Price"] == "$877.8" and table["pricing"] == [877.8]
    assert table["query"] == "console tables" and table["category"] == "garden"
    assert table["Attributes"] == ["console table", "solid wood"]
    assert table["options"] == {} and table["option_to_image"] == {}
    assert table["MainImage"] == raw[0]["images"][0]
    assert table["BulletPoints"] == raw[0]["small_description"]
    assert table["Reviews"] == [] and table["Rating"] == "N.A."
    assert not {"brand", "seller_id", "product_information", "small_description_old"} & set(table)

    pumps = by_asin["B08R3XSC65"]
    assert pumps["pricing"] == [100.0] and pumps["Price"] == "$100.0"  # "" -> the default
    assert pumps["Attributes"] == []  # present but empty
    assert by_asin["B09DG92LJL"]["options"] == {}  # {"Color": null}
    shampoo = by_asin["B07B6DVG41"]
    assert shampoo["instruction_text"].startswith("Find me sulfate free, paraben free shampoo")
    assert "hair loss" in shampoo["instruction_attributes"]


def test_engine_schema_details():
    raw = [
        {
            "asin": "A1",
            "name": "T",
            "full_description": "D",
            "small_description": "one bullet",
            "pricing": "$1,299.99 - $1,499.00 - $9.00",
            "images": ["img"],
            "category": "c",
            "query": "  Some Query ",
            "product_category": "x › y",
            "customization_options": {
                "Color": [{"value": " Black/White ", "image": "i1"}],
                "Size": [{"value": "XL"}],
                "Style": None,
            },
        },
        {"asin": "A1", "name": "dup"},
        {"asin": "nan", "name": "x"},
        {"asin": "B0123456789X"},
    ]
    reviews = [
        {"asin": "A1", "reviews": [{"title": "ok", "stars": 4, "review": "fine"}, {"score": 2}], "average_rating": 3.0}
    ]
    (p,) = catalog.build_products(raw, {}, None, reviews)
    assert p["pricing"] == [1299.99, 1499.0] and p["Price"] == "$1299.99 to $1499.0"
    assert p["query"] == "some query" and p["BulletPoints"] == ["one bullet"]
    assert p["options"] == {"color": ["black | white"], "size": ["xl"]}
    assert p["option_to_image"] == {"black | white": "i1", "xl": None}
    assert p["Attributes"] == ["DUMMY_ATTR"]
    assert p["Reviews"] == [{"title": "ok", "score": 4, "body": "fine"}, {"score": 2, "body": ""}]
    assert p["Rating"] == 3.0


def test_official_store_synthetic_and_human_goals(official, tmp_path):
    folder = _official_dir(tmp_path)
    store = ST.build_store(data_dir=folder)
    assert store.source == "official" and len(store.products) == 4 and not store.human_goals
    # only B07B6DVG41 has an instruction; it has no options -> one goal
    (goal,) = store.goals
    assert goal["asin"] == "B07B6DVG41" and goal["goal_options"] == {}
    assert re.fullmatch(r"Find me .+, and price lower than \d+\.00 dollars", goal["instruction_text"])
    assert store.reward(0, "B07B6DVG41", {})[0] == 1.0

    human = json.loads(SAMPLE_HUMAN.read_text())
    record = dict(
        human["B01HOMR4AU"][0],
        asin="B06Y3VLDFB",
        instruction="i want a rustic console table.",
        instruction_attributes=["solid wood"],
        instruction_options=[],
    )
    folder2 = _official_dir(tmp_path / "h", {"B06Y3VLDFB": [record, dict(record, instruction_attributes=[])]})
    store = ST.build_store(data_dir=folder2)
    assert store.human_goals and len(store.goals) == 1  # the one without attributes is skipped
    goal = store.goals[0]
    assert goal["instruction_text"].startswith("i want a rustic console table, and price lower than")
    assert goal["goal_options"] == [] and goal["weight"] == 1 and goal["name"].startswith("Vhomes")
    assert goal["price_upper"] in PRICE_RANGE and goal["price_upper"] > store.prices["B06Y3VLDFB"]
    assert store.reward(0, "B06Y3VLDFB", {})[0] == 1.0


def test_missing_or_corrupt_official_files(tmp_path):
    with pytest.raises(WebShopDataError, match="does not exist"):
        catalog.load_official(tmp_path / "nowhere")
    (tmp_path / "items_shuffle_1000.json").write_text("[]")
    with pytest.raises(WebShopDataError, match="items_ins_v2_1000.json or items_ins_v2.json"):
        catalog.load_official(tmp_path)
    (tmp_path / "items_ins_v2_1000.json").write_text("{not json")
    with pytest.raises(WebShopDataError, match="cannot read .*items_ins_v2_1000.json"):
        catalog.load_official(tmp_path)
    (tmp_path / "items_ins_v2_1000.json").write_text("{}")
    with pytest.raises(WebShopDataError, match="no goals"):
        ST.build_store(data_dir=tmp_path)


def test_goal_order_is_the_originals(official):
    """Undoing our shuffle on the official human_goals.json (the goals in the environment's
    order) puts the instructions of one product next to each other, as they are before the
    shuffle (the instructions of B01HOMR4AU, the one sample product with eight)."""
    shuffled = json.loads((SHARED_WEBSHOP / "human_goals.json").read_text())
    order = G.shuffle_goals(list(range(len(shuffled))))  # position -> index before the shuffle
    before = {}
    for position, original_index in enumerate(order):
        before.setdefault(shuffled[position], []).append(original_index)
    human = json.loads(SAMPLE_HUMAN.read_text())
    found = []
    for record in human["B01HOMR4AU"]:
        text = record["instruction"].strip(".").replace("'", "")
        found += before.get(text, [])
    assert len(found) >= 5
    assert max(found) - min(found) < len(human["B01HOMR4AU"])


def _goal_product(goal: dict) -> dict:
    return {
        "asin": goal["asin"],
        "name": goal["name"],
        "Title": goal["name"],
        "query": goal["query"],
        "product_category": goal["product_category"],
        "Attributes": list(goal["attributes"]),
        "BulletPoints": [],
        "Description": "",
    }


def test_human_trajectory_goals_reward_their_own_product(official):
    paths = sorted(glob.glob(str(SHARED_WEBSHOP / "human_trajs" / "*.jsonl")))
    assert paths
    for path in paths:
        records = [json.loads(line) for line in open(path)]
        goal = records[0]["goal"]
        assert set(goal) == {
            "asin",
            "category",
            "query",
            "name",
            "product_category",
            "instruction_text",
            "attributes",
            "price_upper",
            "goal_options",
            "weight",
        }
        options = {("size" if v.isdigit() else "color"): v for v in goal["goal_options"]}
        total, info = get_reward(_goal_product(goal), goal, goal["price_upper"] / 2, options)
        assert total == 1.0, (path, info)
        for done in (r for r in records if r["page"] == "done"):
            if done["content"]["asin"] == goal["asin"]:  # bought the goal product itself
                total, info = get_reward(
                    _goal_product(goal), goal, done["content"]["price"], done["content"]["options"]
                )
                assert total == done["reward"]
                for key in ("r_type", "r_att", "query_match", "category_match", "r_price"):
                    assert info[key] == done["reward_info"][key]


# --------------------------------------------------------------------------- built-in catalog


def test_builtin_default_catalog(store1k):
    assert store1k.source == "builtin" and len(store1k.products) == builtin.DEFAULT_NUM_PRODUCTS
    assert {p["category"] for p in store1k.products} == set(builtin.CATEGORIES.values())
    assert len({p["product_category"] for p in store1k.products}) == 30
    assert len({p["asin"] for p in store1k.products}) == 1000
    assert 2500 <= len(store1k.goals) <= 5000
    ranged = [p for p in store1k.products if len(p["pricing"]) == 2]
    assert ranged and all(p["Price"] == f"${p['pricing'][0]} to ${p['pricing'][1]}" for p in ranged)
    assert all(p["pricing"][0] <= store1k.prices[p["asin"]] <= p["pricing"][1] for p in ranged)
    assert any(p["pricing"] == [100.0] for p in store1k.products)
    assert any(p["Reviews"] for p in store1k.products)
    assert all(p["Attributes"] and p["BulletPoints"] for p in store1k.products)


def test_builtin_raw_files_follow_the_official_format(official):
    products, attributes, reviews = builtin.generate(50)
    sample = json.loads(SAMPLE_PRODUCTS.read_text())[0]
    assert set(products[0]) <= set(sample) | {"small_description_old"}
    assert {
        "asin",
        "name",
        "full_description",
        "pricing",
        "images",
        "product_category",
        "small_description",
        "customization_options",
        "category",
        "query",
    } <= set(products[0])
    official_ins = json.loads(ATTRIBUTES_1000.read_text())
    keysets = {tuple(sorted(v)) for v in official_ins.values()}
    assert {tuple(sorted(v)) for v in attributes.values()} <= keysets
    assert all(set(r) == {"asin", "reviews", "average_rating"} for r in reviews)
    assert all(
        re.fullmatch(r"Find me [a-z0-9&',\- ]+", v["instruction"]) for v in attributes.values() if "instruction" in v
    )


def test_builtin_prefix_and_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVRL_CACHE", str(tmp_path))
    small = builtin.generate(40)
    assert builtin.generate(80)[0][:40] == small[0]  # product i ignores later products
    first = builtin.load_builtin(40, use_cache=True)
    folder = tmp_path / "webshop" / builtin.builtin_dir_name(40)
    assert sorted(p.name for p in folder.iterdir()) == sorted(builtin.FILES)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temp left
    assert builtin.load_builtin(40, use_cache=True) == first == small


def test_synthetic_goal_text_and_price_bounds(store1k):
    for goal in store1k.goals[:300]:
        product = store1k.by_asin[goal["asin"]]
        assert goal["name"] == product["Title"]
        assert set(goal["goal_options"]) == set(product["options"])
        options = ", and ".join(f"{k}: {v}" for k, v in goal["goal_options"].items())
        suffix = f" with {options}" if options else ""
        price = store1k.prices[goal["asin"]]
        above = [p for p in PRICE_RANGE if p > price][:4]
        if len(above) >= 2:
            assert goal["price_upper"] in above[1:]
            suffix += f", and price lower than {goal['price_upper']:.2f} dollars"
        else:
            assert goal["price_upper"] == G.NO_PRICE_BOUND
        assert goal["instruction_text"] == product["instruction_text"] + suffix
    per_product = {}
    for goal in store1k.goals:
        per_product[goal["asin"]] = per_product.get(goal["asin"], 0) + 1
    assert max(per_product.values()) == G.BUILTIN_MAX_GOALS_PER_PRODUCT


def test_reward_of_goal_product_is_one(store1k):
    for i in store1k.split_goals("test")[:100]:
        goal = store1k.goals[i]
        total, info = store1k.reward(i, goal["asin"], dict(goal["goal_options"]))
        assert total == 1.0, info


# --------------------------------------------------------------------------- splits and sessions


def test_splits_fixed_disjoint_and_ood_held_out(store1k):
    splits = {s: store1k.split_goals(s) for s in G.SPLITS}
    assert splits["test"] == list(range(500)) and splits["eval"] == list(range(500, 1500))
    everything = [i for s in G.SPLITS for i in splits[s]]
    assert sorted(everything) == list(range(len(store1k.goals)))  # disjoint and complete
    held = store1k.held_out_categories()
    # one leaf per top-level category in the built-in catalog
    category_of = {g["product_category"]: g["category"] for g in store1k.goals}
    assert sorted(category_of[path] for path in held) == sorted(builtin.CATEGORIES.values())
    assert all(store1k.goals[i]["product_category"] in held for i in splits["test_ood"])
    assert not {store1k.goals[i]["product_category"] for i in splits["train"]} & held
    assert len(splits["test_ood"]) >= 100 and len(splits["train"]) >= 1000
    with pytest.raises(ValueError, match="train, eval, test, test_ood"):
        store1k.split_goals("valid")


def test_small_catalogs_still_have_every_split():
    store = ST.build_store(num_products=100)
    sizes = {s: len(store.split_goals(s)) for s in G.SPLITS}
    assert all(sizes.values()), sizes


def test_goal_for_session(store1k):
    assert store1k.goal_for_session("fixed_0") == 0
    assert store1k.goal_for_session(f"fixed_{len(store1k.goals) - 1}") == len(store1k.goals) - 1
    for bad in (f"fixed_{len(store1k.goals)}", "fixed_x"):
        with pytest.raises(ValueError):
            store1k.goal_for_session(bad)
    train = set(store1k.split_goals("train"))
    picks = [store1k.goal_for_session(f"user{i}") for i in range(200)]
    assert set(picks) <= train and len(set(picks)) > 50
    assert picks == [store1k.goal_for_session(f"user{i}") for i in range(200)]


def test_load_store_is_cached_per_arguments(store1k):
    assert ST.load_store() is store1k and ST.load_store(1000) is store1k
    assert ST.load_store(100) is not store1k


# --------------------------------------------------------------------------- search


def test_search_finds_the_goal_product(store1k):
    goals = [store1k.goals[i] for i in store1k.split_goals("test")[:100]]
    top1 = sum(store1k.search(g["name"])[0]["asin"] == g["asin"] for g in goals)
    top10 = sum(g["asin"] in [p["asin"] for p in store1k.search(g["name"])[:10]] for g in goals)
    assert top1 >= 85 and top10 == 100
    results = store1k.search("wireless earbuds")
    assert 0 < len(results) <= S.SEARCH_RETURN_N
    assert all(isinstance(p, dict) and "Title" in p for p in results)
    assert store1k.search("") == [] and store1k.search("zzzzqqq") == []


def test_s_stemmer_and_analysis():
    words = ("ponies", "shoes", "glasses", "boxes", "watches", "bus", "dress", "cats", "is", "cases")
    assert [S.s_stem(w) for w in words] == [
        "pony",
        "shoe",
        "glass",
        "box",
        "watch",
        "bus",
        "dress",
        "cat",
        "is",
        "case",
    ]
    assert S.analyze("The Shoes, for Women!") == ["shoe", "women"]


def test_search_index_cache_round_trip(store1k, tmp_path):
    built = S.SearchIndex.build(store1k.products, use_cache=True, cache_dir=tmp_path)
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("index-")]) == 1
    loaded = S.SearchIndex.build(store1k.products, use_cache=True, cache_dir=tmp_path)
    for query in ("potato chips", "console table black", "lipstick long lasting"):
        assert built.search(query) == loaded.search(query) == store1k._index.search(query)


# --------------------------------------------------------------------------- determinism

_FINGERPRINT = r"""
import hashlib, json, sys
from envrl.envs.webshop import builtin, store
s = store.load_store()
h = lambda x: hashlib.sha256(json.dumps(x, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
queries = [g["name"] for g in s.goals[:30]] + ["wireless earbuds", "gluten free cookies"]
print(json.dumps({
    "catalog": builtin.catalog_digest(1000),
    "products": h(s.products), "prices": h(s.prices), "goals": h(s.goals),
    "splits": h({k: s.split_goals(k) for k in ("train", "eval", "test", "test_ood")}),
    "search": h([[p["asin"] for p in s.search(q)] for q in queries]),
    "sessions": [s.goal_for_session(f"abc{i}") for i in range(20)],
}))
"""


def test_same_data_in_separate_processes(store1k):
    outputs = []
    for hash_seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, ENVRL_WEBSHOP_NOUNS="approx")
        env.pop("WEBSHOP_DATA", None)
        out = subprocess.run(
            [sys.executable, "-c", _FINGERPRINT],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        outputs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert outputs[0] == outputs[1]

    def h(x):
        return hashlib.sha256(json.dumps(x, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    assert outputs[0]["goals"] == h(store1k.goals)
    assert outputs[0]["splits"] == h({k: store1k.split_goals(k) for k in G.SPLITS})
    assert outputs[0]["catalog"] == builtin.catalog_digest(1000)


def test_prices_are_seeded(store1k):
    again = catalog.product_prices(store1k.products)
    assert again == store1k.prices
    state = random.getstate()
    random.seed(1)
    assert catalog.product_prices(store1k.products) == again  # global RNG plays no part
    random.setstate(state)


# --------------------------------------------------------------------------- scale


@pytest.mark.slow
def test_100k_builtin_store_builds_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVRL_CACHE", str(tmp_path))
    t0 = time.perf_counter()
    cold = ST.build_store(num_products=100_000)
    t1 = time.perf_counter()
    warm = ST.build_store(num_products=100_000)
    t2 = time.perf_counter()
    print(f"100k: cold {t1 - t0:.1f}s, cached {t2 - t1:.1f}s, goals {len(cold.goals)}")
    assert len(cold.products) == 100_000 and cold.goals == warm.goals
    goal = cold.goals[0]
    assert goal["asin"] in [p["asin"] for p in warm.search(goal["name"])[:10]]
    t = time.perf_counter()
    for g in cold.goals[:200]:
        warm.search(g["name"])
    per_query = (time.perf_counter() - t) / 200
    print(f"100k search: {per_query * 1000:.2f} ms/query")
    assert per_query < 0.05
