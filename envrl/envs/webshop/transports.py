"""Three ways for the env to reach the WebShop site; all return the page as served.

* ``InProcessTransport``: Flask's test client on the site object. Real routes, real
  templates, no sockets: the fast default.
* ``HTTPTransport``: a ``requests`` session to a running server (``envrl webshop serve`` or
  the container), so many env processes can share one site.
* ``BrowserTransport``: headless Chromium through selenium, clicking the real elements and
  typing into the real search box; the page comes back as the browser's DOM.

A transport only moves between pages: it never decides what a click means. The env reads
every page with ``page.parse_page`` and asks the transport to follow a ``Clickable`` (by its
``href``, or in the browser by its ``selector``) or to submit a search, so the three give
the same observations for the same actions.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from envrl.envs.webshop.page import Clickable, Page

#: seconds to wait for one page (HTTP request or browser navigation)
PAGE_TIMEOUT = 30.0


class WebShopConnectionError(RuntimeError):
    """The site cannot be reached or answered with an error: the episode cannot go on."""


@dataclass(frozen=True)
class Fetched:
    """A served page: its URL path (with query) and its HTML."""

    url: str
    html: str


def _path_of(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


class Transport(ABC):
    @abstractmethod
    def open(self, path: str) -> Fetched:
        """Load the page at ``path`` (e.g. ``/fixed_3``)."""

    @abstractmethod
    def search(self, page: Page, query: str) -> Fetched:
        """Submit ``query`` in the search form of ``page``."""

    @abstractmethod
    def click(self, page: Page, clickable: Clickable) -> Fetched:
        """Follow ``clickable`` on ``page``."""

    def close(self) -> None:  # noqa: B027 - a no-op on purpose: most transports hold nothing to free
        """Free what the transport holds (a connection pool, a browser)."""


class InProcessTransport(Transport):
    """The site's Flask app, called through its test client in this process."""

    def __init__(self, app: Any):
        self._client = app.test_client()

    def _answer(self, response: Any) -> Fetched:
        if response.status_code >= 400:
            raise WebShopConnectionError(
                f"the site answered {response.status_code} for {response.request.path}: "
                f"{response.get_data(as_text=True)[:200]}"
            )
        request = response.request
        query = request.query_string.decode()
        return Fetched(request.path + (f"?{query}" if query else ""), response.get_data(as_text=True))

    def open(self, path: str) -> Fetched:
        return self._answer(self._client.get(path, follow_redirects=True))

    def search(self, page: Page, query: str) -> Fetched:
        action = page.search_action or page.url
        return self._answer(self._client.post(action, data={"search_query": query}, follow_redirects=True))

    def click(self, page: Page, clickable: Clickable) -> Fetched:
        return self.open(clickable.href)


class HTTPTransport(Transport):
    """A running WebShop server at ``base_url`` (``http://host:port``)."""

    def __init__(self, base_url: str, timeout: float = PAGE_TIMEOUT):
        import requests

        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._session = requests.Session()

    def _request(self, method: str, path: str, **kwargs: Any) -> Fetched:
        import requests

        url = self.base_url + path
        try:
            response = self._session.request(method, url, timeout=self.timeout, allow_redirects=True, **kwargs)
        except requests.RequestException as exc:
            raise WebShopConnectionError(f"cannot reach the WebShop server at {self.base_url}: {exc}") from exc
        if response.status_code >= 400:
            raise WebShopConnectionError(
                f"the WebShop server answered {response.status_code} for {path}: {response.text[:200]}"
            )
        response.encoding = "utf-8"
        return Fetched(_path_of(response.url), response.text)

    def open(self, path: str) -> Fetched:
        return self._request("GET", path)

    def search(self, page: Page, query: str) -> Fetched:
        return self._request("POST", page.search_action or page.url, data={"search_query": query})

    def click(self, page: Page, clickable: Clickable) -> Fetched:
        return self.open(clickable.href)

    def close(self) -> None:
        self._session.close()


#: flags that keep headless Chromium offline and quiet (it otherwise phones home)
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--no-first-run",
)


class BrowserTransport(Transport):
    """Headless Chromium (selenium) on a server at ``base_url``: real clicks, real typing."""

    def __init__(self, base_url: str, timeout: float = PAGE_TIMEOUT):
        try:
            from selenium import webdriver
            from selenium.webdriver.chrome.service import Service
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError("mode='browser' needs selenium: pip install 'envrl[browser]'") from exc
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="envrl-chromium-")
        options = webdriver.ChromeOptions()
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={self._profile}")
        binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
        if binary:
            options.binary_location = binary
        driver_path = shutil.which("chromedriver")
        if binary is None or driver_path is None:
            shutil.rmtree(self._profile, ignore_errors=True)
            raise WebShopConnectionError(
                "mode='browser' needs Chromium and chromedriver on PATH "
                "(Debian: apt-get install chromium chromium-driver)"
            )
        try:
            self._driver = webdriver.Chrome(options=options, service=Service(driver_path))
        except Exception as exc:
            shutil.rmtree(self._profile, ignore_errors=True)
            raise WebShopConnectionError(f"Chromium did not start: {exc}") from exc
        self._driver.set_page_load_timeout(timeout)

    def _current(self) -> Fetched:
        return Fetched(_path_of(self._driver.current_url), self._driver.page_source)

    def _wait_for_navigation(self, before: Any) -> None:
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(self._driver, self.timeout).until(expected_conditions.staleness_of(before))
        WebDriverWait(self._driver, self.timeout).until(
            lambda driver: driver.execute_script("return document.readyState") == "complete"
        )

    def open(self, path: str) -> Fetched:
        try:
            self._driver.get(self.base_url + path)
        except Exception as exc:
            raise WebShopConnectionError(f"the browser could not load {path}: {exc}") from exc
        return self._current()

    def search(self, page: Page, query: str) -> Fetched:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        box = self._driver.find_element(By.ID, "search_input")
        root = self._driver.find_element(By.TAG_NAME, "html")
        box.clear()
        box.send_keys(query)
        box.send_keys(Keys.ENTER)
        self._wait_for_navigation(root)
        return self._current()

    def click(self, page: Page, clickable: Clickable) -> Fetched:
        from selenium.webdriver.common.by import By

        element = self._driver.find_element(By.CSS_SELECTOR, clickable.selector)
        root = self._driver.find_element(By.TAG_NAME, "html")
        element.click()
        self._wait_for_navigation(root)
        return self._current()

    def close(self) -> None:
        try:
            self._driver.quit()
        finally:
            shutil.rmtree(self._profile, ignore_errors=True)


class LocalServer:
    """The site served on a free local port from a background thread (for the browser mode
    when no ``server_url`` is given). werkzeug's threaded server: fine for one browser."""

    def __init__(self, app: Any, host: str = "127.0.0.1"):
        from werkzeug.serving import make_server

        self._server = make_server(host, 0, app, threaded=True)
        self.url = f"http://{host}:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="envrl-webshop-site", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
