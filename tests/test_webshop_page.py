"""Reading WebShop pages (``envrl.envs.webshop.page``): observations and clickables.

Pinned strings for small pages rendered by the site's own templates, the clickables of every
page kind on the real store, and the reading's independence from how the HTML is serialized
(BeautifulSoup re-serializations always; a real headless Chromium under ``-m browser``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from urllib.parse import urlsplit

import pytest

pytest.importorskip("flask")
bs4 = pytest.importorskip("bs4")

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from envrl.envs.webshop.page import OBSERVATION_MODES, Clickable, parse_page, render_observation  # noqa: E402
from envrl.envs.webshop.site import create_app, done_url, item_sub_url, item_url, results_url  # noqa: E402
from envrl.envs.webshop.store import load_store  # noqa: E402

INSTRUCTION = "i need a blue cotton shirt, and price lower than 30.00 dollars"
PRODUCT = {
    "asin": "B0TESTSHRT",
    "Title": "Acme Cotton Shirt & Tie <Set>",
    "Price": "$19.99",
    "Rating": "N.A.",
    "options": {"color": ["blue", "red"], "size": ["small", "x-large"]},
    "Description": "Soft.\r\nWarm.",
    "BulletPoints": ["100% cotton", "machine wash"],
    "Reviews": [{"title": "Nice", "score": 5, "body": "fits"}],
    "Attributes": ["cotton"],
    "category": "fashion",
    "query": "shirts",
    "product_category": "Shirts",
}


@pytest.fixture(scope="module")
def store():
    return load_store()


@pytest.fixture(scope="module")
def app(store):
    return create_app(store)


@pytest.fixture()
def client(app):
    return app.test_client()


def _render_item_page(app, chosen: dict[str, str]) -> tuple[str, str]:
    """The item page of the hand-written PRODUCT, rendered by the site's template (no store involved)."""
    from envrl.envs.webshop import site

    keywords = ["blue", "shirt"]
    with app.test_request_context():
        html = site.render_template(
            "item.html",
            instruction=INSTRUCTION,
            home_url="/fixed_7",
            product=PRODUCT,
            asin=PRODUCT["asin"],
            options_json=json.dumps(chosen),
            back_url=results_url("fixed_7", keywords, 2),
            groups=site.option_groups("fixed_7", PRODUCT["asin"], keywords, 2, PRODUCT, chosen),
            sub_pages=[
                (name, item_sub_url("fixed_7", PRODUCT["asin"], keywords, 2, name, chosen))
                for name in ("Description", "Features", "Reviews")
            ],
            buy_url=done_url("fixed_7", PRODUCT["asin"], chosen),
        )
    return html, item_url("fixed_7", PRODUCT["asin"], keywords, 2, chosen)


# ---- pinned observations -----------------------------------------------------------------------


def test_item_page_text_is_pinned(app):
    html, url = _render_item_page(app, {"size": "x-large"})
    page = parse_page(html, url)
    assert render_observation(page, "text") == (
        "Instruction: [SEP] i need a blue cotton shirt, and price lower than 30.00 dollars [SEP] Back to Search "
        "[SEP] < Prev [SEP] color [SEP] blue [SEP] red [SEP] size [SEP] small [SEP] x-large "
        "[SEP] Acme Cotton Shirt & Tie <Set> [SEP] Price: $19.99 [SEP] Rating: N.A. [SEP] Description "
        "[SEP] Features [SEP] Reviews [SEP] Buy Now"
    )


def test_item_page_text_rich_is_pinned(app):
    html, url = _render_item_page(app, {"color": "blue", "size": "x-large"})
    page = parse_page(html, url)
    assert render_observation(page, "text_rich") == (
        "You have clicked x-large.\n"
        "You have clicked blue.\n"
        "Instruction:\n"
        "i need a blue cotton shirt, and price lower than 30.00 dollars\n"
        "[button] Back to Search [button_]\n"
        "[button] < Prev [button_]\n"
        "color\n"
        "  [clicked button] blue [clicked button_]\n"
        "  [button] red [button_]\n"
        "size\n"
        "  [button] small [button_]\n"
        "  [clicked button] x-large [clicked button_]\n"
        "Acme Cotton Shirt & Tie <Set>\n"
        "Price: $19.99\n"
        "Rating: N.A.\n"
        "[button] Description [button_]\n"
        "[button] Features [button_]\n"
        "[button] Reviews [button_]\n"
        "[button] Buy Now [button_]\n"
    )


def test_item_page_clickables(app):
    html, url = _render_item_page(app, {"color": "blue"})
    page = parse_page(html, url)
    assert page.kind == "item" and not page.has_search_bar and page.search_action is None
    assert page.instruction == INSTRUCTION and page.asin == "B0TESTSHRT" and page.options == {"color": "blue"}
    assert page.reward is None and page.reward_info is None
    assert list(page.clickables) == [
        "back to search",
        "< prev",
        "blue",
        "red",
        "small",
        "x-large",
        "description",
        "features",
        "reviews",
        "buy now",
    ]
    assert page.clickables["back to search"] == Clickable(
        text="back to search", href="/fixed_7", selector='[data-clickable="back-to-search"]', kind="button"
    )
    assert page.clickables["< prev"].href == "/search_results/fixed_7/%5B'blue',%20'shirt'%5D/2"
    assert page.clickables["x-large"] == Clickable(
        text="x-large",
        kind="option",
        selector='[data-clickable="option-1-1"]',
        href="/item_page/fixed_7/B0TESTSHRT/%5B'blue',%20'shirt'%5D/2/"
        "%7B%22color%22:%20%22blue%22,%20%22size%22:%20%22x-large%22%7D",
    )
    assert page.clickables["buy now"].href == "/done/fixed_7/B0TESTSHRT/%7B%22color%22:%20%22blue%22%7D"
    assert page.clickables["reviews"].href.startswith("/item_sub_page/fixed_7/B0TESTSHRT/")
    assert {c.kind for c in page.clickables.values()} == {"button", "option"}
    selectors = [c.selector for c in page.clickables.values()]
    assert len(set(selectors)) == len(selectors)


def test_small_hand_written_page():
    """The reading needs only the markers: a minimal page in the site's markup."""
    html = (
        "<html><head><title>WebShop</title><style>p { color: red }</style></head>"
        '<body data-page="results"><div id="instruction-text"><h4>Instruction:<br>'
        '<span id="instruction">find a mug</span></h4></div>'
        '<a class="btn" data-kind="button" data-clickable="back-to-search" href="/s">Back to Search</a>'
        "<h3>Page 1 (Total results: 2)</h3><!-- a comment -->"
        '<h4><a class="product-link" data-kind="product" data-clickable="product-0" href="/i/B01">B01</a></h4>'
        "<h4>Blue &amp; White Mug</h4><h5>$5.0</h5>"
        '<h4><a class="product-link" data-kind="product" data-clickable="product-1" href="/i/B02">B02</a></h4>'
        "<h4>Red Mug</h4><h5>$6.5 to $7.0</h5>"
        '<script>var hidden = "not text";</script></body></html>'
    )
    page = parse_page(html, "/search_results/s/x/1")
    assert render_observation(page, "text") == (
        "Instruction: [SEP] find a mug [SEP] Back to Search [SEP] Page 1 (Total results: 2) [SEP] B01 [SEP] "
        "Blue & White Mug [SEP] $5.0 [SEP] B02 [SEP] Red Mug [SEP] $6.5 to $7.0"
    )
    assert render_observation(page, "text_rich", visited_asins=["b02"]) == (
        "Instruction:\nfind a mug\n[button] Back to Search [button_]\nPage 1 (Total results: 2)\n"
        "\n[button] B01 [button_]\nBlue & White Mug\n$5.0\n"
        "\n[clicked button] B02 [clicked button_]\nRed Mug\n$6.5 to $7.0\n"
    )
    assert list(page.clickables) == ["back to search", "b01", "b02"]
    assert page.clickables["b01"] == Clickable("b01", "/i/B01", '[data-clickable="product-0"]', "product")
    assert render_observation(page, "html") == html


def test_done_page_reading():
    payload = {
        "reward": 0.75,
        "reward_info": {"r_type": 1.0, "r_att": 0.5},
        "instruction": "buy a mug",
        "asin": "B01",
        "options": {},
        "goal_index": 3,
        "session_id": "fixed_3",
    }
    html = (
        '<!DOCTYPE html><html><body data-page="done" data-asin="B01" data-options="{}">'
        '<h1>Thank you for shopping with us!</h1><h3 id="reward">Your score (min 0.0, max 1.0)</h3>'
        f'<div>0.75</div><script type="application/json" id="reward-info">{json.dumps(payload)}</script>'
        "</body></html>"
    )
    page = parse_page(html, "/done/fixed_3/B01/%7B%7D")
    assert page.kind == "done" and page.reward == 0.75 and page.reward_info == {"r_type": 1.0, "r_att": 0.5}
    assert page.instruction == "buy a mug" and page.asin == "B01" and page.clickables == {}
    assert render_observation(page, "text") == (
        "Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] 0.75"
    )


def test_modes_and_errors():
    html = '<html><body data-page="search"><form action="/x"><input id="search_input"></form></body></html>'
    page = parse_page(html, "/x")
    assert page.has_search_bar and page.search_action == "/x"
    assert OBSERVATION_MODES == ("text", "text_rich", "html")
    with pytest.raises(ValueError):
        render_observation(page, "url")
    with pytest.raises(ValueError):
        parse_page("<html><body><p>not the shop</p></body></html>", "/")
    with pytest.raises(ValueError):
        parse_page("", "/")


# ---- every page kind on the real store ------------------------------------------------------------


def _pages(client, store) -> dict[str, str]:
    """The URL of one page of each kind (plus a results page for a hostile query)."""
    product = max(store.products, key=lambda p: len(p.get("options") or {}))
    keywords = product["Title"].lower().split(" ")
    chosen = {name: values[0] for name, values in product["options"].items()}
    evil = client.post("/fixed_9", data={"search_query": "<b>bold</b> & 'q' \"dq\" ../x"}).headers["Location"]
    return {
        "search": "/fixed_9",
        "results": results_url("fixed_9", keywords, 1),
        "results2": results_url("fixed_9", keywords, 2),
        "evil": evil,
        "item": item_url("fixed_9", product["asin"], keywords, 1, {}),
        "item_chosen": item_url("fixed_9", product["asin"], keywords, 1, chosen),
        "description": item_sub_url("fixed_9", product["asin"], keywords, 1, "Description", chosen),
        "features": item_sub_url("fixed_9", product["asin"], keywords, 1, "Features", chosen),
        "reviews": item_sub_url("fixed_9", product["asin"], keywords, 1, "Reviews", chosen),
        "attributes": item_sub_url("fixed_9", product["asin"], keywords, 1, "Attributes", chosen),
        "done": done_url("fixed_9", product["asin"], chosen),
    }


def test_clickables_of_each_page_kind(client, store):
    pages = {}
    for name, url in _pages(client, store).items():
        response = client.get(url)
        assert response.status_code == 200, name
        pages[name] = parse_page(response.get_data(as_text=True), url)
    instruction = store.goals[9]["instruction_text"]
    assert all(page.instruction == instruction for page in pages.values())
    assert pages["search"].kind == "search" and pages["search"].clickables == {}
    for name in ("results", "results2", "evil"):
        page = pages[name]
        buttons = [t for t, c in page.clickables.items() if c.kind == "button"]
        products = [t for t, c in page.clickables.items() if c.kind == "product"]
        assert page.kind == "results" and buttons[0] == "back to search" and len(products) <= 10
        assert all(t == t.lower() and page.clickables[t].href.startswith("/item_page/fixed_9/") for t in products)
    assert [t for t, c in pages["results"].clickables.items() if c.kind == "button"] == ["back to search", "next >"]
    assert [t for t, c in pages["results2"].clickables.items() if c.kind == "button"][:2] == [
        "back to search",
        "< prev",
    ]
    item = pages["item_chosen"]
    assert item.kind == "item" and {c.kind for c in item.clickables.values()} == {"button", "option"}
    option_count = sum(len(v) for v in store.by_asin[item.asin]["options"].values())
    assert len([c for c in item.clickables.values() if c.kind == "option"]) <= option_count
    for name in ("description", "features", "reviews", "attributes"):
        assert pages[name].kind == "item_sub" and list(pages[name].clickables) == ["back to search", "< prev"]
        assert pages[name].options == item.options
    assert pages["done"].kind == "done" and pages["done"].clickables == {} and pages["done"].reward is not None
    for page in pages.values():
        for clickable in page.clickables.values():
            assert client.get(clickable.href).status_code == 200


def test_description_page_text(client, store):
    product = next(p for p in store.products if p.get("Description"))
    url = item_sub_url("fixed_0", product["asin"], ["x"], 1, "Description", {})
    page = parse_page(client.get(url).get_data(as_text=True), url)
    assert render_observation(page, "text") == (
        f"Instruction: [SEP] {store.goals[0]['instruction_text']} [SEP] Back to Search [SEP] < Prev "
        f"[SEP] {product['Description'].strip()}"
    )


# ---- serialization independence ----------------------------------------------------------------------


def _reading(page, visited=()) -> tuple:
    return (
        page.kind,
        page.has_search_bar,
        page.search_action,
        page.clickables,
        page.instruction,
        page.reward,
        page.reward_info,
        page.asin,
        dict(page.options),
        render_observation(page, "text"),
        render_observation(page, "text_rich", visited),
    )


def _reserializations(html: str) -> list[str]:
    soup = bs4.BeautifulSoup(html, "html.parser")
    # CRLF line ends: every line break of the document (a CR, LF or CRLF, which HTML reads alike) as CRLF; a
    # plain replace of LF would turn a text's CRLF into CR CR LF, two line breaks, another document
    crlf = html.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\r\n")
    return [str(soup), soup.prettify(), soup.decode(formatter="html5"), crlf]


def test_reading_survives_reserialization(client, store):
    for name, url in _pages(client, store).items():
        html = client.get(url).get_data(as_text=True)
        page = parse_page(html, url)
        visited = [c.text for c in page.clickables.values() if c.kind == "product"][:2]
        expected = _reading(page, visited)
        for variant in _reserializations(html):
            assert _reading(parse_page(variant, url), visited) == expected, name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(title=st.text(max_size=40), price=st.text(max_size=12), instruction=st.text(max_size=40))
@example(title="", price="", instruction="0\r\n0")  # a CRLF in the text (hypothesis found it once)
def test_any_text_reads_back_the_same(app, title, price, instruction):
    """Whatever the catalog text, it is shown escaped and read back (stripped) the same way."""
    from envrl.envs.webshop import site

    with app.test_request_context():
        html = site.render_template(
            "results.html",
            instruction=instruction,
            home_url="/fixed_0",
            page=1,
            total=1,
            prev_url=None,
            next_url=None,
            items=[{"asin": "B0FUZZ0001", "title": title, "price": price, "url": "/item"}],
        )
    page = parse_page(html, "/search_results/fixed_0/x/1")
    text = render_observation(page, "text")
    for value in (title, price):
        cleaned = value.replace("\r\n", "\n").replace("\r", "\n").strip()
        if cleaned:
            assert cleaned in text
    assert page.instruction == instruction.replace("\r\n", "\n").replace("\r", "\n").strip()
    assert list(page.clickables) == ["back to search", "b0fuzz0001"]
    for variant in _reserializations(html):
        assert _reading(parse_page(variant, "/x")) == _reading(page)


# ---- a real browser ---------------------------------------------------------------------------------


@pytest.mark.browser
def test_browser_page_source_reads_the_same(app, client, store):
    """Headless Chromium walks search -> results -> item -> option -> sub-page -> back -> buy; at every
    step its DOM (``page_source``) reads exactly as the HTML the site served for that URL."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("Chromium and chromedriver are not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    profile = tempfile.mkdtemp(prefix="envrl-test-chromium-")
    options = webdriver.ChromeOptions()
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.binary_location = chromium
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    base = f"http://127.0.0.1:{server.server_port}"
    visited: list[str] = []
    differing: list[bool] = []  # the browser's DOM is a re-serialization, not the bytes served

    def compare() -> object:
        parts = urlsplit(driver.current_url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        served = client.get(path)
        assert served.status_code == 200
        expected = parse_page(served.get_data(as_text=True), path)
        source = driver.page_source
        differing.append(source != expected.html)
        seen = parse_page(source, path)
        assert _reading(seen, visited) == _reading(expected, visited)
        return seen

    def click(page, text: str):
        root = driver.find_element(By.TAG_NAME, "html")
        driver.find_element(By.CSS_SELECTOR, page.clickables[text].selector).click()
        WebDriverWait(driver, 20).until(expected_conditions.staleness_of(root))
        return compare()

    try:
        goal = store.goals[11]
        driver.get(base + "/fixed_11")
        page = compare()
        assert page.kind == "search"
        box = driver.find_element(By.ID, "search_input")
        root = driver.find_element(By.TAG_NAME, "html")
        box.send_keys(store.by_asin[goal["asin"]]["Title"] + " <b>&amp; 'quotes' \"x\" ../..")
        box.send_keys(Keys.ENTER)
        WebDriverWait(driver, 20).until(expected_conditions.staleness_of(root))
        page = compare()
        assert page.kind == "results"
        if "next >" in page.clickables:
            page = click(page, "next >")
            page = click(page, "< prev")
        product = next(t for t, c in page.clickables.items() if c.kind == "product")
        visited.append(product)
        page = click(page, product)
        assert page.kind == "item"
        options = [t for t, c in page.clickables.items() if c.kind == "option"]
        if options:
            page = click(page, options[-1])
            assert options[-1] in render_observation(page, "text_rich")
        page = click(page, "reviews")
        assert page.kind == "item_sub"
        page = click(page, "< prev")
        page = click(page, "buy now")
        assert page.kind == "done" and page.reward is not None
        assert all(differing) and len(differing) >= 7
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()
        shutil.rmtree(profile, ignore_errors=True)
