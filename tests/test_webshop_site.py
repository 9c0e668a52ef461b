"""The WebShop site (``envrl.envs.webshop.site``) on the real built-in store.

Routes, the page flow of the original (search -> results -> item -> options -> sub-pages ->
back -> buy), the reward on the done page, statelessness, and hostile input (hypothesis):
never a 500, invalid input is a 4xx, and nothing from the input is echoed unescaped.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from typing import Any
from urllib.parse import quote, quote_from_bytes

import pytest

pytest.importorskip("flask")
pytest.importorskip("bs4")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from envrl.envs.webshop import site  # noqa: E402
from envrl.envs.webshop.page import parse_page, render_observation  # noqa: E402
from envrl.envs.webshop.site import (  # noqa: E402
    MAX_QUERY_CHARS,
    SUB_PAGES,
    create_app,
    done_url,
    item_sub_url,
    item_url,
    results_url,
)
from envrl.envs.webshop.store import load_store  # noqa: E402

HYPOTHESIS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
OUR_SCRIPT = '<script type="application/json" id="reward-info">'


@pytest.fixture(scope="module")
def store():
    return load_store()


@pytest.fixture(scope="module")
def app(store):
    return create_app(store)


@pytest.fixture()
def client(app):
    return app.test_client()


def _get(client, path: str):
    response = client.get(path)
    return response, parse_page(response.get_data(as_text=True), path) if response.status_code == 200 else None


def _product_with_options(store) -> dict[str, Any]:
    """A product with at least two option groups (or one), for the option flow."""
    ranked = sorted(store.products, key=lambda p: -min(len(p.get("options") or {}), 2))
    product = ranked[0]
    assert product.get("options"), "the built-in catalog should have products with options"
    return product


def _goal_option_choice(store, goal: dict[str, Any]) -> dict[str, str]:
    """The goal's options as a {name: value} choice on its product (goal_options may be a list of values)."""
    product = store.by_asin[goal["asin"]]
    wanted = goal["goal_options"]
    if isinstance(wanted, dict):
        return {name: value for name, value in wanted.items() if value in (product["options"].get(name) or [])}
    choice = {}
    for value in wanted:
        for name, values in product.get("options", {}).items():
            if value in values and name not in choice:
                choice[name] = value
                break
    return choice


def _assert_safe(body: str) -> None:
    """No markup from the input: the only <script> is the site's own JSON on the done page."""
    assert "<script" not in body.replace(OUR_SCRIPT, ""), body[:500]


# ---- routes -----------------------------------------------------------------------------------


def test_healthz(client, store):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.get_json() == {"status": "ok", "products": len(store.products), "goals": len(store.goals)}


def test_root_redirects_to_a_session(client):
    response = client.get("/")
    assert response.status_code == 302
    page_response = client.get(response.headers["Location"])
    assert page_response.status_code == 200
    assert parse_page(page_response.get_data(as_text=True), response.headers["Location"]).kind == "search"


def test_search_page(client, store):
    response, page = _get(client, "/fixed_0")
    assert response.status_code == 200 and response.mimetype == "text/html"
    assert page.kind == "search" and page.has_search_bar and page.search_action == "/fixed_0"
    assert page.instruction == store.goals[0]["instruction_text"]
    assert page.clickables == {}
    assert render_observation(page, "text") == f"WebShop [SEP] Instruction: [SEP] {page.instruction} [SEP] Search"


def test_search_redirects_with_the_original_keywords(client):
    response = client.post("/fixed_0", data={"search_query": "Red  Shoes"})
    assert response.status_code == 302
    assert response.headers["Location"] == results_url("fixed_0", ["red", "", "shoes"], 1)
    assert "%5B'red',%20'',%20'shoes'%5D" in response.headers["Location"]  # the list repr, as the original


def test_results_pages_and_paging(client, store):
    query = store.products[0]["Title"].lower()
    hits = store.search(query)
    assert len(hits) > 10, "a product title should match more than one page of products"
    pages = []
    response = client.post("/fixed_1", data={"search_query": query}, follow_redirects=True)
    page = parse_page(response.get_data(as_text=True), response.request.path)
    while True:
        assert page.kind == "results" and not page.has_search_bar
        products = [c for c in page.clickables.values() if c.kind == "product"]
        pages.append([c.text for c in products])
        assert 1 <= len(products) <= 10
        number = len(pages)
        assert f"Page {number} (Total results: {len(hits)})" in render_observation(page, "text")
        assert ("< prev" in page.clickables) == (number > 1)
        assert "back to search" in page.clickables
        if "next >" not in page.clickables:
            break
        page = _get(client, page.clickables["next >"].href)[1]
    assert len(pages) == min(5, -(-len(hits) // 10))
    assert [asin for chunk in pages for asin in chunk] == [p["asin"].lower() for p in hits[:50]]
    back = _get(client, page.clickables["< prev"].href)[1]
    assert [c.text for c in back.clickables.values() if c.kind == "product"] == pages[-2]
    home = _get(client, page.clickables["back to search"].href)[1]
    assert home.kind == "search" and home.instruction == store.goals[1]["instruction_text"]


def test_result_page_out_of_range_is_404(client, store):
    query = store.products[0]["Title"].lower()
    pages = -(-len(store.search(query)) // 10)
    assert client.get(results_url("fixed_0", query.split(" "), pages)).status_code == 200
    assert client.get(results_url("fixed_0", query.split(" "), pages + 1)).status_code == 404
    assert client.get(results_url("fixed_0", query.split(" "), 0)).status_code == 400


def test_plain_string_keywords_are_accepted(client, store):
    word = store.products[0]["Title"].split()[0].lower()
    plain = client.get(f"/search_results/fixed_0/{quote(word)}/1")
    listed = client.get(results_url("fixed_0", [word], 1))
    assert plain.status_code == listed.status_code == 200
    assert plain.get_data() == listed.get_data()


def test_item_flow_options_sub_pages_and_buy(client, store):
    product = _product_with_options(store)
    asin = product["asin"]
    keywords = product["Title"].lower().split(" ")
    url = item_url("fixed_2", asin, keywords, 1, {})
    response, page = _get(client, url)
    assert response.status_code == 200 and page.kind == "item" and page.asin == asin and page.options == {}
    text = render_observation(page, "text")
    assert text.startswith(f"Instruction: [SEP] {store.goals[2]['instruction_text']} [SEP] Back to Search [SEP] < Prev")
    assert text.endswith(
        f"Price: {product['Price']} [SEP] Rating: {product['Rating']} [SEP] "
        "Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    assert [k for k, c in page.clickables.items() if c.kind == "button"] == [
        "back to search",
        "< prev",
        "description",
        "features",
        "reviews",
        "buy now",
    ]
    # choose one value per option group, clicking the links
    chosen: dict[str, str] = {}
    for name, values in product["options"].items():
        value = values[-1]
        clickable = page.clickables[value.lower()]
        assert clickable.kind == "option"
        page = _get(client, clickable.href)[1]
        chosen[name] = value
        assert page.options == chosen
        rich = render_observation(page, "text_rich")
        assert f"  [clicked button] {value} [clicked button_]" in rich
        assert rich.startswith(f"You have clicked {value}.\n")
    item_page_url = page.url
    # every sub-page, and back to the item page with the same choices
    for sub in ("description", "features", "reviews"):
        sub_page = _get(client, page.clickables[sub].href)[1]
        assert sub_page.kind == "item_sub" and sub_page.options == chosen
        assert list(sub_page.clickables) == ["back to search", "< prev"]
        back = _get(client, sub_page.clickables["< prev"].href)[1]
        assert back.kind == "item" and back.options == chosen and back.html == page.html
    attributes = _get(client, item_sub_url("fixed_2", asin, keywords, 1, "Attributes", chosen))[1]
    for attribute in product.get("Attributes") or []:
        assert attribute in render_observation(attributes, "text")
    # < Prev on the item page goes back to the result page it came from
    results = _get(client, page.clickables["< prev"].href)[1]
    assert results.kind == "results"
    assert item_page_url.startswith("/item_page/")
    # buy
    done_response, done = _get(client, page.clickables["buy now"].href)
    assert done_response.status_code == 200 and done.kind == "done"
    expected, info = store.reward(2, asin, chosen)
    assert done.reward == float(expected)
    assert done.reward_info == json.loads(json.dumps(site.jsonable(info)))
    assert done.asin == asin and done.options == chosen and done.clickables == {}
    text = render_observation(done, "text")
    assert text.startswith("Thank you for shopping with us!")
    assert text.endswith(f"Your score (min 0.0, max 1.0) [SEP] {float(expected)}")
    assert f"asin [SEP] {asin}" in text


def test_buying_the_goal_scores_one(client, store):
    """For goals whose product, options and price fit, the site's done page scores 1.0."""
    perfect = 0
    for index in range(min(len(store.goals), 40)):
        goal = store.goals[index]
        choice = _goal_option_choice(store, goal)
        expected, _ = store.reward(index, goal["asin"], choice)
        page = _get(client, done_url(f"fixed_{index}", goal["asin"], choice))[1]
        assert page.reward == float(expected)
        perfect += page.reward == 1.0
    assert perfect > 0, "buying the goal product with the goal options should score 1.0 for some goals"


def test_unknown_things_are_4xx(client, store):
    asin = store.products[0]["asin"]
    assert client.get(f"/fixed_{len(store.goals)}").status_code == 404
    assert client.get("/fixed_-1").status_code in (400, 404)
    assert client.get(item_url("fixed_0", "NOSUCHASIN", ["x"], 1, {})).status_code == 404
    assert client.get(item_sub_url("fixed_0", asin, ["x"], 1, "Secrets", {})).status_code == 404
    assert client.get(item_url("fixed_0", asin, ["x"], 6, {})).status_code == 404
    assert client.get(done_url("fixed_0", asin, {"no such option": "x"})).status_code == 400
    assert client.get("/no/such/route/at/all/here/really").status_code == 404
    assert client.open("/healthz", method="DELETE").status_code == 405


def test_oversized_input_is_refused(client, store):
    assert client.post("/fixed_0", data={"search_query": "a" * (MAX_QUERY_CHARS + 1)}).status_code == 413
    assert client.post("/fixed_0", data={"search_query": "a" * MAX_QUERY_CHARS}).status_code == 302
    assert client.post("/fixed_0", data={"search_query": "x" * 200_000}).status_code == 413
    assert client.get(f"/search_results/fixed_0/{quote(str(['a'] * 4000))}/1").status_code == 414
    assert client.get(f"/search_results/fixed_0/{quote(str(['a'] * 500))}/1").status_code == 200
    assert client.get(f"/search_results/fixed_0/{quote(str(['a'] * 600))}/1").status_code == 414  # 1,199 chars
    longest = client.post("/fixed_0", data={"search_query": "\x01" * MAX_QUERY_CHARS})  # repr: 4 chars each
    assert longest.status_code == 302 and client.get(longest.headers["Location"]).status_code == 200
    assert client.get(f"/search_results/fixed_0/{'[' * 3000}/1").status_code == 400
    assert client.get(f"/search_results/fixed_0/{'[' * 300 + ']' * 300}/1").status_code == 400
    assert client.get(f"/{'s' * 300}").status_code == 400
    options = quote(json.dumps({"k": "v" * 20_000}))
    assert client.get(f"/done/fixed_0/{store.products[0]['asin']}/{options}").status_code == 414


def test_non_utf8_bytes_are_400(client):
    # werkzeug's test client turns bad bytes into U+FFFD before the app sees them ...
    assert client.get("/%FF%FE").status_code == 400
    assert (
        client.post(
            "/fixed_0", data=b"search_query=%FF%FE", content_type="application/x-www-form-urlencoded"
        ).status_code
        == 400
    )
    # ... a real server passes the raw bytes (gunicorn's RAW_URI), which the site checks exactly
    assert client.get("/fixed_0", environ_overrides={"RAW_URI": "/fixed_0%FF"}).status_code == 400
    assert client.get("/fixed_0", environ_overrides={"RAW_URI": "/fixed_\xff"}).status_code == 400
    assert client.get("/fixed_0", environ_overrides={"RAW_URI": "/fixed_0"}).status_code == 200


def test_search_terms_are_escaped(client):
    evil = "<script>alert(1)</script> \"quoted\" 'single' ../../etc/passwd %2F?x=1#frag \\ & <b>"
    response = client.post("/fixed_0", data={"search_query": evil}, follow_redirects=True)
    assert response.status_code == 200
    body = response.get_data(as_text=True)
    _assert_safe(body)
    page = parse_page(body, response.request.path)
    assert page.kind == "results"
    for clickable in page.clickables.values():  # every href stays one absolute path of the site
        assert clickable.href.startswith("/") and "/../" not in clickable.href and "?" not in clickable.href
        assert "#" not in clickable.href and "\\" not in clickable.href
        assert client.get(clickable.href).status_code == 200


def test_keywords_with_slashes_round_trip(client, store):
    product = store.products[0]
    keywords = ["a/b", "..", "c//d", "x?y#z", "100%"]
    page = _get(client, item_url("fixed_0", product["asin"], keywords, 1, {}))[1]
    results = _get(client, page.clickables["< prev"].href)[1]
    assert results.kind == "results"
    assert results.html == client.get(results_url("fixed_0", keywords, 1)).get_data(as_text=True)


def test_option_values_with_slashes_round_trip(store):
    """Option values with "/", "%", "#" or "\\" (official data has them) survive the URL trip."""
    product = copy.deepcopy(_product_with_options(store))
    name = next(iter(product["options"]))
    odd = ["1/2 inch", "50% off #1", "a\\b", "../up"]
    product["options"][name] = list(product["options"][name]) + odd
    patched = copy.copy(store)  # the real store, with this one product's options extended
    patched.by_asin = {**store.by_asin, product["asin"]: product}
    client = create_app(patched).test_client()
    page = _get(client, item_url("fixed_0", product["asin"], ["x"], 1, {}))[1]
    for value in odd:
        chosen = _get(client, page.clickables[value].href)[1]
        assert chosen.kind == "item" and chosen.options == {name: value}
        done = _get(client, chosen.clickables["buy now"].href)[1]
        assert done.options == {name: value} and done.reward == float(
            patched.reward(0, product["asin"], {name: value})[0]
        )


def test_every_sampled_product_renders(client, store):
    for product in store.products[::10]:
        chosen = {name: values[-1] for name, values in (product.get("options") or {}).items()}
        paths = [item_url("fixed_0", product["asin"], ["x"], 1, chosen), done_url("fixed_0", product["asin"], chosen)]
        paths += [item_sub_url("fixed_0", product["asin"], ["x"], 1, sub, chosen) for sub in SUB_PAGES]
        for path in paths:
            response = client.get(path)
            assert response.status_code == 200, path
            assert parse_page(response.get_data(as_text=True), path).asin == product["asin"]


def test_options_accept_json_and_the_original_dict_repr(client, store):
    product = _product_with_options(store)
    name, values = next(iter(product["options"].items()))
    as_json = client.get(f"/done/fixed_0/{product['asin']}/{quote(json.dumps({name: values[0]}))}")
    as_repr = client.get(f"/done/fixed_0/{product['asin']}/{quote(repr({name: values[0]}))}")
    assert as_json.status_code == as_repr.status_code == 200
    assert as_json.get_data() == as_repr.get_data()


# ---- statelessness and determinism --------------------------------------------------------------


def _walk(client, session: str, store) -> list[bytes]:
    product = _product_with_options(store)
    keywords = product["Title"].lower().split(" ")
    name, values = next(iter(product["options"].items()))
    paths = [
        f"/{session}",
        results_url(session, keywords, 1),
        item_url(session, product["asin"], keywords, 1, {}),
        item_url(session, product["asin"], keywords, 1, {name: values[0]}),
        item_sub_url(session, product["asin"], keywords, 1, "Reviews", {name: values[0]}),
        done_url(session, product["asin"], {name: values[0]}),
    ]
    return [client.get(path).get_data() for path in paths]


def test_sessions_do_not_affect_each_other(app, store):
    alone_a = _walk(app.test_client(), "fixed_3", store)
    alone_b = _walk(app.test_client(), "fixed_4", store)
    client = app.test_client()
    interleaved = list(zip(_walk(client, "fixed_3", store), _walk(client, "fixed_4", store)))
    assert [a for a, _ in interleaved] == alone_a
    assert [b for _, b in interleaved] == alone_b
    assert alone_a != alone_b
    assert _walk(client, "fixed_3", store) == alone_a  # and again, after the other session bought


def test_pages_are_the_same_bytes_in_another_process(app, store):
    paths = [
        "/fixed_5",
        results_url("fixed_5", ["shoes"], 1),
        item_url("fixed_5", _product_with_options(store)["asin"], ["shoes"], 1, {}),
        done_url("fixed_5", store.goals[5]["asin"], _goal_option_choice(store, store.goals[5])),
    ]
    client = app.test_client()
    here = [hashlib.sha256(client.get(path).get_data()).hexdigest() for path in paths]
    script = (
        "import hashlib, json, sys\n"
        "from envrl.envs.webshop.site import create_app\n"
        "client = create_app().test_client()\n"
        "print(json.dumps([hashlib.sha256(client.get(p).get_data()).hexdigest() for p in json.loads(sys.argv[1])]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(paths)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here


# ---- hostile input (hypothesis) -----------------------------------------------------------------

segment_text = st.text(max_size=60)
segment_bytes = st.binary(max_size=40)


def _encoded(value: str | bytes) -> str:
    return quote_from_bytes(value, safe="") if isinstance(value, bytes) else quote(value, safe="")


def _check(response, must_fail: bool = False) -> None:
    assert response.status_code < 500, response.get_data(as_text=True)[:300]
    if must_fail:
        assert 400 <= response.status_code < 500
    body = response.get_data(as_text=True)
    _assert_safe(body)
    if response.status_code >= 400:
        assert response.mimetype == "text/plain" and len(body) < 300


@HYPOTHESIS
@given(st.one_of(segment_text, segment_bytes))
def test_fuzz_session_id(client, value):
    for path in (f"/{_encoded(value)}", f"/search_results/{_encoded(value)}/%5B'x'%5D/1"):
        response = client.get(path)
        _check(response)
        if response.status_code == 200:
            assert parse_page(response.get_data(as_text=True), path).kind in ("search", "results")


@HYPOTHESIS
@given(st.one_of(segment_text, segment_bytes, st.lists(st.text(max_size=12), max_size=6).map(str)))
def test_fuzz_keywords(client, store, value):
    asin = store.products[0]["asin"]
    for path in (
        f"/search_results/fixed_0/{_encoded(value)}/1",
        f"/item_page/fixed_0/{asin}/{_encoded(value)}/1/%7B%7D",
    ):
        response = client.get(path)
        _check(response)
        if response.status_code == 200:  # every link on the page works
            page = parse_page(response.get_data(as_text=True), path)
            for clickable in list(page.clickables.values())[:3]:
                _check(client.get(clickable.href))


@HYPOTHESIS
@given(st.one_of(segment_text, segment_bytes, st.integers(-10, 10**6).map(str)))
def test_fuzz_page_number(client, store, value):
    asin = store.products[0]["asin"]
    # bytes such as b"7" are a valid page number too once decoded
    text = value if isinstance(value, str) else value.decode("utf-8", errors="replace")
    valid = text.isascii() and text.isdigit() and not text.startswith("0")
    for path in (
        f"/search_results/fixed_0/%5B'shoes'%5D/{_encoded(value)}",
        f"/item_page/fixed_0/{asin}/%5B'shoes'%5D/{_encoded(value)}/%7B%7D",
    ):
        response = client.get(path)
        _check(response, must_fail=not valid)


@HYPOTHESIS
@given(st.one_of(segment_text, segment_bytes))
def test_fuzz_asin(client, store, value):
    known = isinstance(value, str) and value in store.by_asin
    for path in (
        f"/item_page/fixed_0/{_encoded(value)}/%5B'x'%5D/1/%7B%7D",
        f"/done/fixed_0/{_encoded(value)}/%7B%7D",
        f"/item_sub_page/fixed_0/{_encoded(value)}/%5B'x'%5D/1/Features/%7B%7D",
    ):
        _check(client.get(path), must_fail=not known)


option_values = st.one_of(
    segment_text,
    segment_bytes,
    st.dictionaries(st.text(max_size=10), st.one_of(st.text(max_size=10), st.integers(), st.none()), max_size=3).map(
        json.dumps
    ),
    st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3).map(repr),
)


@HYPOTHESIS
@given(option_values)
def test_fuzz_options(client, store, value):
    product = _product_with_options(store)
    for path in (
        f"/item_page/fixed_0/{product['asin']}/%5B'x'%5D/1/{_encoded(value)}",
        f"/done/fixed_0/{product['asin']}/{_encoded(value)}",
    ):
        response = client.get(path)
        _check(response)
        if response.status_code == 200:
            chosen = parse_page(response.get_data(as_text=True), path).options
            assert all(v in product["options"][k] for k, v in chosen.items())


@HYPOTHESIS
@given(st.one_of(segment_text, segment_bytes, st.sampled_from(SUB_PAGES)))
def test_fuzz_sub_page(client, store, value):
    asin = store.products[0]["asin"]
    response = client.get(f"/item_sub_page/fixed_0/{asin}/%5B'x'%5D/1/{_encoded(value)}/%7B%7D")
    _check(response, must_fail=value not in SUB_PAGES)


@HYPOTHESIS
@given(st.one_of(st.text(max_size=200), st.binary(max_size=100)))
def test_fuzz_search_query(client, value):
    body = (b"search_query=" + quote_from_bytes(value, safe="").encode()) if isinstance(value, bytes) else None
    if body is not None:
        response = client.post("/fixed_0", data=body, content_type="application/x-www-form-urlencoded")
    else:
        response = client.post("/fixed_0", data={"search_query": value})
    _check(response)
    if response.status_code == 302:
        results = client.get(response.headers["Location"])
        _check(results)
        assert results.status_code == 200
        assert parse_page(results.get_data(as_text=True), response.headers["Location"]).kind == "results"
    elif isinstance(value, str) and value.strip() and "\ufffd" not in value:
        pytest.fail(f"a valid query was refused with {response.status_code}")
