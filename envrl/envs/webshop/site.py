"""The WebShop site: the original's page flow, served by Flask.

The pages and their order follow WebShop (Yao et al., 2022): a search page with the goal's
instruction, result pages of 10 products (the best 50 hits), a product page with its option
choices, its Description / Features / Reviews (/ Attributes) sub-pages and a "Buy Now"
button, and a done page with the purchase score. The visible labels an agent acts on
("Back to Search", "< Prev", "Next >", "Buy Now", "Page 1 (Total results: 50)", ...) are the
original's, so text observations read like the original's (``page.py`` turns a page into one).

**Stateless.** The server keeps nothing between requests: a page is a pure function of its
URL. The session id picks the goal (``store.goal_for_session``: ``fixed_<i>`` is goal ``i``),
and the keywords, result page, product and chosen options travel in the path, as in the
original's URLs. So sessions can never see each other's state, any worker of a multi-process
server can answer any request, the same request gives the same bytes in any process, and
memory stays bounded however many sessions there are. (The original kept a per-session dict
that grew forever and, for ids other than ``fixed_<i>``, drew the goal at random.)

**Every navigation is a link.** Buttons, product links and option choices are ``<a href>``
elements (the search box is a plain form), so the site works without JavaScript and a
client that only follows hrefs walks the same pages a browser clicks through. Each clickable
element carries ``data-kind`` and a page-unique ``data-clickable`` id for ``page.py``.

**Untrusted URLs.** Path parameters are parsed, never evaluated: keywords are the original's
list repr (``['red', 'shoes']``, read with ``ast.literal_eval`` after a length cap, then
type-checked) or a plain string; options are JSON or the original's dict repr, and must name
options the product has. Anything invalid, oversized or unknown is a 4xx with a short plain
message that never echoes the input; everything rendered goes through Jinja's autoescape.
"""

from __future__ import annotations

import ast
import json
import math
import re
import threading
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import quote, unquote_to_bytes

from flask import Flask, Response, jsonify, redirect, render_template, request
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as WerkzeugResponse

if TYPE_CHECKING:  # the store module is imported lazily: the site is importable on its own
    from envrl.envs.webshop.store import WebShopStore

#: the search returns this many products at most, shown PRODUCT_WINDOW to a page
SEARCH_RETURN_N = 50
PRODUCT_WINDOW = 10
MAX_RESULT_PAGES = SEARCH_RETURN_N // PRODUCT_WINDOW

#: the labels the agent clicks (the original's)
END_BUTTON = "Buy Now"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BACK_TO_SEARCH = "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")

#: the longest search query accepted (characters); longer is 413
MAX_QUERY_CHARS = 1000
#: the longest keywords or options path parameter accepted (decoded characters); longer is 414.
#: Room for the list repr of any accepted query (repr escapes a character in up to 10).
MAX_PARAM_CHARS = 16_000
#: the longest session id accepted
MAX_SESSION_CHARS = 200
#: request bodies (the search form) larger than this are refused by Flask with 413
MAX_BODY_BYTES = 64 * 1024

#: where ``/`` sends a visitor: the first goal of the fixed order
HOME_SESSION = "fixed_0"

PACKAGE_DIR = Path(__file__).resolve().parent
_PAGE_NUMBER = re.compile(r"[1-9][0-9]{0,3}")
# U+FFFD is what undecodable bytes become on their way in; surrogates cannot be encoded back
_UNDECODABLE = "\ufffd"


# ---- errors ---------------------------------------------------------------------------------


class _Refused(HTTPException):
    """A 4xx with a fixed, short message (never the offending input)."""

    def __init__(self, code: int, message: str):
        super().__init__(description=message)
        self.code = code


def _refuse(code: int, message: str) -> NoReturn:
    raise _Refused(code, message)


def _plain_error(error: HTTPException) -> Response:
    text = f"{error.code} {error.name}: {error.description}\n" if error.description else f"{error.code} {error.name}\n"
    response = Response(text, status=error.code, mimetype="text/plain")
    for key, value in error.get_headers():  # keeps e.g. Allow on a 405
        if key.lower() != "content-type":
            response.headers[key] = value
    return response


# ---- URLs: building ------------------------------------------------------------------------
# Every segment is percent-encoded except for a few harmless characters, so that a "/", "?",
# "#", "%" or "\" in a query or option value never splits or truncates a path, and browsers
# (which rewrite "\" and dot segments) leave the hrefs as written.


def _segment(text: str) -> str:
    return quote(text, safe="',:")


def _keywords_param(keywords: list[str]) -> str:
    """The original's form: the list's Python repr, e.g. ``['red', 'shoes']``."""
    return _segment(str(keywords))


def _options_param(options: dict[str, str]) -> str:
    """JSON with ``/`` written as ``\\u002f``: the options segment never contains a slash."""
    return _segment(json.dumps(options, ensure_ascii=False).replace("/", "\\u002f"))


def search_url(session_id: str) -> str:
    return f"/{_segment(session_id)}"


def results_url(session_id: str, keywords: list[str], page: int) -> str:
    return f"/search_results/{_segment(session_id)}/{_keywords_param(keywords)}/{page}"


def item_url(session_id: str, asin: str, keywords: list[str], page: int, options: dict[str, str]) -> str:
    return (
        f"/item_page/{_segment(session_id)}/{_segment(asin)}/{_keywords_param(keywords)}/{page}/"
        f"{_options_param(options)}"
    )


def item_sub_url(
    session_id: str, asin: str, keywords: list[str], page: int, sub_page: str, options: dict[str, str]
) -> str:
    return (
        f"/item_sub_page/{_segment(session_id)}/{_segment(asin)}/{_keywords_param(keywords)}/{page}/"
        f"{_segment(sub_page)}/{_options_param(options)}"
    )


def done_url(session_id: str, asin: str, options: dict[str, str]) -> str:
    return f"/done/{_segment(session_id)}/{_segment(asin)}/{_options_param(options)}"


# ---- URLs: reading --------------------------------------------------------------------------


def _has_bad_characters(text: str) -> bool:
    return _UNDECODABLE in text or any(unicodedata.category(ch) == "Cs" for ch in text)


def parse_keywords(raw: str) -> list[str]:
    """``['red', 'shoes']`` (the original's list repr) or a plain string -> the keyword list."""
    if len(raw) > MAX_PARAM_CHARS:
        _refuse(414, "the keywords are too long")
    if raw.startswith("["):
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            _refuse(400, "the keywords are not a list of strings")
        if not isinstance(value, list) or not value or not all(isinstance(word, str) for word in value):
            _refuse(400, "the keywords are not a list of strings")
        keywords = value
    else:
        keywords = [raw]
    if any(_has_bad_characters(word) for word in keywords):
        _refuse(400, "the keywords are not valid UTF-8 text")
    if len(" ".join(keywords)) > MAX_QUERY_CHARS:
        _refuse(414, "the keywords are too long")
    return keywords


def parse_page_number(raw: str, last: int) -> int:
    """A result page number: ASCII digits, 1..last."""
    if not _PAGE_NUMBER.fullmatch(raw):
        _refuse(400, "the page number is not a positive integer")
    page = int(raw)
    if page > last:
        _refuse(404, "no such result page")
    return page


def parse_options(raw: str, product: dict[str, Any]) -> dict[str, str]:
    """JSON or the original's dict repr -> the chosen options, in the product's option order.

    Every name must be one of the product's options and every value one of its values, so a
    purchase can only be scored with choices the product page offers.
    """
    if len(raw) > MAX_PARAM_CHARS:
        _refuse(414, "the options are too long")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            _refuse(400, "the options are not a dict of strings")
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        _refuse(400, "the options are not a dict of strings")
    offered: dict[str, list[str]] = product.get("options") or {}
    for name, choice in value.items():
        if name not in offered or choice not in offered[name]:
            _refuse(400, "the options are not offered for this product")
    return {name: value[name] for name in offered if name in value}


def _check_raw_path() -> None:
    """Refuse a request path whose percent-escapes are not UTF-8.

    Servers decode such bytes to U+FFFD before routing; the raw URI (gunicorn's ``RAW_URI``,
    werkzeug's ``REQUEST_URI``) still has them, so the check is exact where a server gives it.
    """
    raw = request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI")
    if not raw:
        return
    try:
        path = raw.split("?", 1)[0].encode("latin-1")
    except UnicodeEncodeError:  # not a WSGI byte string: nothing raw to check
        return
    try:
        unquote_to_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        _refuse(400, "the path is not valid UTF-8")


def _check_form_bytes(body: bytes) -> None:
    """Refuse a urlencoded form whose escapes are not UTF-8 (werkzeug would keep them as text)."""
    try:
        unquote_to_bytes(body.replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError:
        _refuse(400, "the form is not valid UTF-8")


# ---- rendering helpers ----------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """The reward details as plain JSON values (sets sorted, numpy scalars unwrapped)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(item) for item in value), key=repr)
    if hasattr(value, "item"):  # numpy scalar
        try:
            return jsonable(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def option_groups(
    session_id: str, asin: str, keywords: list[str], page: int, product: dict[str, Any], chosen: dict[str, str]
) -> list[dict[str, Any]]:
    """The item page's option buttons: per option name, each value with whether it is chosen and
    the URL that chooses it (keeping the other choices), in the product's option order."""
    groups = []
    for name, values in (product.get("options") or {}).items():
        choices = []
        for value in values:
            updated = dict(chosen)
            updated[name] = value
            updated = {key: updated[key] for key in product["options"] if key in updated}
            choices.append(
                {
                    "value": value,
                    "selected": chosen.get(name) == value,
                    "url": item_url(session_id, asin, keywords, page, updated),
                }
            )
        groups.append({"name": name, "choices": choices})
    return groups


# ---- the app ----------------------------------------------------------------------------------


def create_app(store: WebShopStore | None = None) -> Flask:
    """The WebShop site on ``store`` (None: ``load_store()`` on the first request)."""
    app = Flask(
        __name__,
        template_folder=str(PACKAGE_DIR / "templates"),
        static_folder=str(PACKAGE_DIR / "static"),
        static_url_path="/static",
    )
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.url_map.merge_slashes = False  # "//" inside keywords is data, not a typo to redirect
    app.jinja_env.trim_blocks = True
    app.jinja_env.lstrip_blocks = True
    app.jinja_env.keep_trailing_newline = True
    app.register_error_handler(HTTPException, _plain_error)

    holder: dict[str, Any] = {"store": store}
    lock = threading.Lock()

    def the_store() -> WebShopStore:
        if holder["store"] is None:
            with lock:
                if holder["store"] is None:
                    from envrl.envs.webshop.store import load_store

                    holder["store"] = load_store()
        return holder["store"]

    def goal_of(session_id: str) -> tuple[int, dict[str, Any]]:
        if (
            not session_id
            or len(session_id) > MAX_SESSION_CHARS
            or session_id in (".", "..")
            or _has_bad_characters(session_id)
            or any(unicodedata.category(ch) == "Cc" for ch in session_id)
        ):
            _refuse(400, "invalid session id")
        shop = the_store()
        try:
            index = shop.goal_for_session(session_id)
        except (ValueError, IndexError):
            _refuse(404, "no goal for this session id")
        return index, shop.goals[index]

    def product_of(asin: str) -> dict[str, Any]:
        product = the_store().by_asin.get(asin)
        if product is None:
            _refuse(404, "no such product")
        return product

    @app.before_request
    def _screen() -> None:
        _check_raw_path()

    @app.get("/healthz")
    def healthz() -> Response:
        shop = the_store()
        return jsonify(status="ok", products=len(shop.products), goals=len(shop.goals))

    @app.get("/")
    def home() -> WerkzeugResponse:  # redirect() builds werkzeug's Response, not Flask's subclass
        return redirect(search_url(HOME_SESSION), code=302)

    @app.route("/<session_id>", methods=["GET", "POST"])
    def index(session_id: str) -> Any:
        _, goal = goal_of(session_id)
        if request.method == "POST" and request.mimetype == "application/x-www-form-urlencoded":
            _check_form_bytes(request.get_data(cache=True))
        if request.method == "POST" and "search_query" in request.form:
            query = request.form["search_query"]
            if len(query) > MAX_QUERY_CHARS or len(query.lower()) > MAX_QUERY_CHARS:
                _refuse(413, f"the search query is longer than {MAX_QUERY_CHARS} characters")
            if _has_bad_characters(query):
                _refuse(400, "the search query is not valid UTF-8 text")
            if not query.strip():
                _refuse(400, "the search query is empty")
            keywords = query.lower().split(" ")
            return redirect(results_url(session_id, keywords, 1), code=302)
        return render_template(
            "search.html",
            instruction=goal["instruction_text"],
            search_action=search_url(session_id),
            home_url=search_url(session_id),
        )

    @app.route("/search_results/<session_id>/<path:keywords>/<page>", methods=["GET", "POST"])
    def search_results(session_id: str, keywords: str, page: str) -> Any:
        _, goal = goal_of(session_id)
        words = parse_keywords(keywords)
        if not _PAGE_NUMBER.fullmatch(page):
            _refuse(400, "the page number is not a positive integer")
        hits = the_store().search(" ".join(words))[:SEARCH_RETURN_N]
        total = len(hits)
        number = parse_page_number(page, max(1, math.ceil(total / PRODUCT_WINDOW)))
        shown = hits[(number - 1) * PRODUCT_WINDOW : number * PRODUCT_WINDOW]
        items = [
            {
                "asin": p["asin"],
                "title": p.get("Title", p.get("name", "")),
                "price": p.get("Price", ""),
                "url": item_url(session_id, p["asin"], words, number, {}),
            }
            for p in shown
        ]
        return render_template(
            "results.html",
            instruction=goal["instruction_text"],
            home_url=search_url(session_id),
            page=number,
            total=total,
            items=items,
            prev_url=results_url(session_id, words, number - 1) if number > 1 else None,
            next_url=results_url(session_id, words, number + 1) if number * PRODUCT_WINDOW < total else None,
        )

    @app.route("/item_page/<session_id>/<asin>/<path:keywords>/<page>/<options>", methods=["GET", "POST"])
    def item_page(session_id: str, asin: str, keywords: str, page: str, options: str) -> Any:
        _, goal = goal_of(session_id)
        product = product_of(asin)
        words = parse_keywords(keywords)
        number = parse_page_number(page, MAX_RESULT_PAGES)
        chosen = parse_options(options, product)
        return render_template(
            "item.html",
            instruction=goal["instruction_text"],
            home_url=search_url(session_id),
            product=product,
            asin=asin,
            options_json=json.dumps(chosen, ensure_ascii=False),
            back_url=results_url(session_id, words, number),
            groups=option_groups(session_id, asin, words, number, product, chosen),
            sub_pages=[(name, item_sub_url(session_id, asin, words, number, name, chosen)) for name in SUB_PAGES[:3]],
            buy_url=done_url(session_id, asin, chosen),
        )

    @app.route(
        "/item_sub_page/<session_id>/<asin>/<path:keywords>/<page>/<sub_page>/<options>", methods=["GET", "POST"]
    )
    def item_sub_page(session_id: str, asin: str, keywords: str, page: str, sub_page: str, options: str) -> Any:
        _, goal = goal_of(session_id)
        product = product_of(asin)
        words = parse_keywords(keywords)
        number = parse_page_number(page, MAX_RESULT_PAGES)
        if sub_page not in SUB_PAGES:
            _refuse(404, f"no such sub-page (one of {', '.join(SUB_PAGES)})")
        chosen = parse_options(options, product)
        return render_template(
            "item_sub.html",
            instruction=goal["instruction_text"],
            home_url=search_url(session_id),
            product=product,
            asin=asin,
            sub_page=sub_page,
            options_json=json.dumps(chosen, ensure_ascii=False),
            back_url=item_url(session_id, asin, words, number, chosen),
        )

    @app.route("/done/<session_id>/<asin>/<options>", methods=["GET", "POST"])
    def done(session_id: str, asin: str, options: str) -> Any:
        goal_index, goal = goal_of(session_id)
        product = product_of(asin)
        chosen = parse_options(options, product)
        reward, info = the_store().reward(goal_index, asin, chosen)
        reward = float(reward)
        payload = {
            "session_id": session_id,
            "goal_index": goal_index,
            "instruction": goal["instruction_text"],
            "asin": asin,
            "options": chosen,
            "reward": reward,
            "reward_info": jsonable(info),
        }
        return render_template(
            "done.html",
            instruction=goal["instruction_text"],
            goal_index=goal_index,
            asin=asin,
            options_json=json.dumps(chosen, ensure_ascii=False),
            reward=reward,
            payload=payload,
        )

    return app


__all__ = [
    "BACK_TO_SEARCH",
    "END_BUTTON",
    "NEXT_PAGE",
    "PREV_PAGE",
    "PRODUCT_WINDOW",
    "SEARCH_RETURN_N",
    "SUB_PAGES",
    "create_app",
    "done_url",
    "item_sub_url",
    "item_url",
    "parse_keywords",
    "parse_options",
    "results_url",
    "search_url",
]
