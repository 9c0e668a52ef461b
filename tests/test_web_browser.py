"""The results viewer in a real headless Chromium (selenium): what a person clicking through
it sees. Off by default (``-m browser``); skipped when Chromium or chromedriver is missing.

The store is the one ``test_web.py`` builds: real WebShop runs plus a run whose trajectory
holds ``<script>`` and ``<img onerror>`` payloads that would set ``window.__pwned`` or the
page title if they ever ran.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

pytestmark = pytest.mark.browser

pytest.importorskip("selenium")
pytest.importorskip("flask")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the store and helpers of test_web

import test_web as shared  # noqa: E402

from envrl.evaluation.leaderboard import leaderboard_data  # noqa: E402
from envrl.evaluation.metrics import summarize  # noqa: E402
from envrl.evaluation.store import ResultStore  # noqa: E402

CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
TIMEOUT = 20
RUN = "webshop-test-expert-s0"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """The viewer on a free localhost port, served from a thread: (base URL, runs dir)."""
    from werkzeug.serving import make_server

    from envrl.evaluation.web import create_app

    runs_dir = shared.build_store(tmp_path_factory.mktemp("browser-runs"), episodes=4)
    server = make_server("127.0.0.1", 0, create_app(runs_dir), threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="envrl-web-test", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", runs_dir
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("Chromium and chromedriver are not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="envrl-test-chromium-")
    options = webdriver.ChromeOptions()
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.binary_location = chromium
    browser = webdriver.Chrome(options=options, service=Service(driver_path))
    browser.set_page_load_timeout(TIMEOUT)
    try:
        yield browser
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


# ---- helpers -----------------------------------------------------------------------------


def by_id(browser: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, element_id)


def css(browser: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, selector)


def content(element: Any) -> str:
    """The element's text exactly as stored (``.text`` would collapse whitespace)."""
    return element.get_attribute("textContent")


def words(element: Any) -> str:
    return " ".join(content(element).split())


def visible(element: Any) -> str:
    """The element's text as rendered (blocks apart), whitespace collapsed."""
    return " ".join(element.text.split())


def click_and_wait(browser: Any, element: Any) -> None:
    """Click a link and wait until the next page has loaded."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    root = browser.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(browser, TIMEOUT).until(expected_conditions.staleness_of(root))
    WebDriverWait(browser, TIMEOUT).until(lambda b: b.execute_script("return document.readyState") == "complete")


def assert_not_pwned(browser: Any) -> None:
    assert browser.execute_script("return typeof window.__pwned") == "undefined"
    assert "pwned" not in browser.title
    assert browser.execute_script("return document.getElementsByTagName('script').length") == 0


def plot_widths(browser: Any) -> list[int]:
    """naturalWidth of each plot image once every one has finished loading (0: broken)."""
    from selenium.webdriver.support.ui import WebDriverWait

    script = "return Array.from(document.querySelectorAll('img.plot')).every(i => i.complete)"
    WebDriverWait(browser, TIMEOUT).until(lambda b: b.execute_script(script))
    return browser.execute_script("return Array.from(document.querySelectorAll('img.plot')).map(i => i.naturalWidth)")


# ---- tests -------------------------------------------------------------------------------


def test_leaderboard_then_a_run_page_with_its_plots(driver, site):
    base, runs_dir = site
    driver.get(base + "/")
    table = by_id(driver, "leaderboard")
    shown = words(table)
    for agent in ("random", "expert"):
        assert agent in shown
    data = leaderboard_data(runs_dir)
    checked = 0
    for row in data["rows"]:
        for key, cell in row["cells"].items():
            if cell.get("run_id") and cell["success_rate"] is not None:
                [td] = [
                    td
                    for td in css(table, "td.cell")
                    if td.get_attribute("data-column") == key and td.get_attribute("data-run") == cell["run_id"]
                ]
                assert words(css(td, ".rate")[0]) == shared.pct(cell["success_rate"])
                assert words(css(td, ".ci")[0]) == shared.ci(cell["ci_low"], cell["ci_high"])
                checked += 1
    assert checked >= len(shared.REAL_RUNS)
    assert_not_pwned(driver)

    [link] = css(driver, f"#runs tr[data-run='{RUN}'] a")
    click_and_wait(driver, link)
    assert driver.current_url == f"{base}/runs/{RUN}"
    assert words(by_id(driver, "run-id")) == RUN
    m = summarize(next(r for r in ResultStore(runs_dir).list_runs() if r["run_id"] == RUN)["episodes"])
    overall = visible(by_id(driver, "overall"))
    assert f"success % {shared.pct(m.success_rate)} {shared.ci(m.ci_low, m.ci_high)}" in overall
    assert len(css(driver, "#episodes tbody tr")) == m.episodes
    assert plot_widths(driver) == [640, 640, 640]


def test_stepping_through_an_episode(driver, site):
    base, runs_dir = site
    record = ResultStore(runs_dir).load_episodes(RUN)[1]
    n = len(record.trajectory)
    driver.get(f"{base}/runs/{RUN}")
    [link] = css(driver, "#episodes tr[data-index='1'] a.episode-link")
    click_and_wait(driver, link)
    assert words(by_id(driver, "task-id")) == record.task_id
    assert words(by_id(driver, "step-counter")) == f"step 0 of {n}"
    assert content(by_id(driver, "observation")) == record.initial_observation
    assert not css(driver, "#prev")

    for k in range(1, n + 1):
        click_and_wait(driver, by_id(driver, "next"))
        assert words(by_id(driver, "step-counter")) == f"step {k} of {n}"
        assert content(by_id(driver, "action")) == record.trajectory[k - 1].action
        assert content(by_id(driver, "observation")) == record.trajectory[k - 1].observation
        assert driver.current_url.endswith(f"?step={k}")
    assert not css(driver, "#next")  # the last step has no Next

    click_and_wait(driver, by_id(driver, "prev"))
    assert words(by_id(driver, "step-counter")) == f"step {n - 1} of {n}"
    expected = record.trajectory[n - 2].action if n > 1 else None
    if expected is None:
        assert not css(driver, "#action")
    else:
        assert content(by_id(driver, "action")) == expected

    # the action list jumps straight to a step
    items = css(driver, "#actions li a")
    assert [content(a) for a in items[1:]] == [s.action for s in record.trajectory]
    click_and_wait(driver, items[1])
    assert words(by_id(driver, "step-counter")) == f"step 1 of {n}"


def test_hostile_trajectory_text_is_shown_not_run(driver, site):
    base, _ = site
    run = quote(shared.HOSTILE_RUN, safe="")
    driver.get(f"{base}/")
    assert_not_pwned(driver)
    driver.get(f"{base}/runs/{run}")
    assert words(by_id(driver, "run-id")) == shared.HOSTILE_RUN
    assert_not_pwned(driver)
    assert plot_widths(driver) == [640, 640, 640]
    [link] = css(driver, "#episodes tr[data-index='0'] a.episode-link")
    click_and_wait(driver, link)
    assert content(by_id(driver, "observation")) == f"Start {shared.HOSTILE_SCRIPT}"
    assert words(by_id(driver, "task-id")) == f"task{shared.HOSTILE_SCRIPT}"
    for k, step in enumerate(shared.hostile_records()[0].trajectory, 1):
        click_and_wait(driver, by_id(driver, "next"))
        assert_not_pwned(driver)
        assert content(by_id(driver, "action")) == step.action
        assert content(by_id(driver, "observation")) == step.observation
        assert not css(driver, "#observation *")  # text only: no element was made from it
        if k == 1:
            response = [dd for dd in css(driver, "#agent-info dd")][1]
            assert content(response) == step.agent_info["response"]
            assert not css(response, "img")
    driver.get(f"{base}/runs/{run}/episodes/1")
    assert words(by_id(driver, "episode-error")) == f"RuntimeError: {shared.HOSTILE_SCRIPT}"
    assert_not_pwned(driver)
