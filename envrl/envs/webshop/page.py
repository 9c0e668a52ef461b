"""Reading a WebShop page: its HTML -> what the agent sees and what it can click.

The env reaches the site in three ways (in-process, HTTP, a real browser) and reads every
page here, so one action sequence gives the same observations in all three. The reading
therefore depends only on the HTML, and only on what survives a browser re-serializing the
DOM (``driver.page_source``): text nodes, element names and attribute values. Quoting,
entity spelling, attribute order, void-tag syntax and whitespace-only text between tags may
all change there, and none of them is looked at. Whitespace-only text nodes are skipped and
text nodes are stripped, and CR/CRLF read as LF, as a browser's parser normalizes them.
Nor is the URL read: its spelling differs by transport (the test client reports it decoded,
``requests`` and browsers percent-encoded), so the product and the chosen options come from
markers the site writes into the page (``data-asin``, ``data-options``, ``data-selected``).
The page is read in one pass of the standard library's HTML tokenizer (well under 1 ms).

Observation modes (the original text env's ``convert_html_to_text``):

* ``text``: the visible text nodes, stripped, joined by `` [SEP] ``
  (``WebShop [SEP] Instruction: [SEP] <goal> [SEP] Search``);
* ``text_rich``: one line per text node; buttons as ``[button] X [button_]``, options as
  ``  [button] X [button_]`` (chosen ones ``  [clicked button] X [clicked button_]``, with a
  ``You have clicked X.`` line on top for each), product links as ``\\n[button] ASIN [button_]``
  (``[clicked button]`` once visited);
* ``html``: the page as served.

Clickables are the elements that carry ``data-clickable`` (the site puts it on every button,
product link and option link), keyed by their lowercased text, as the original keys its
buttons, product links and radio values. The search box's submit button is not a clickable:
searching is ``search[...]`` (the original listed it, then refused ``click[search]``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

OBSERVATION_MODES = ("text", "text_rich", "html")
PAGE_KINDS = ("search", "results", "item", "item_sub", "done")
CLICKABLE_KINDS = ("button", "product", "option")

#: text inside these elements is never shown (the original's ``tag_visible``)
_INVISIBLE_PARENTS = frozenset({"style", "script", "head", "title", "meta", "[document]", "noscript", "template"})
#: elements that never have content (and so never hold text)
_VOID_ELEMENTS = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}
)


@dataclass(frozen=True)
class Clickable:
    """One thing the agent can ``click[...]`` on a page."""

    text: str  #: what the agent writes inside click[...]: lowercased ("buy now", "next >", "b07xyz1234", "blue")
    href: str  #: the URL path the click leads to, for clients that follow links
    selector: str  #: a CSS selector unique in the page, for a real browser to click
    kind: str  #: "button" | "product" | "option"


@dataclass(frozen=True)
class Page:
    """A parsed WebShop page."""

    url: str
    html: str
    kind: str  #: "search" | "results" | "item" | "item_sub" | "done"
    has_search_bar: bool
    search_action: str | None  #: the search form's action path, when has_search_bar
    clickables: dict[str, Clickable]  #: in page order, keyed by text
    instruction: str  #: the goal's instruction text shown on the page
    reward: float | None  #: on the done page
    reward_info: dict | None  #: on the done page: the store's verbose reward details
    asin: str | None = None  #: the product on item, item_sub and done pages
    options: Mapping[str, str] = field(default_factory=dict)  #: the options chosen there (name -> value)
    #: the visible text nodes, with how each is marked in ``text_rich``: (text, role, chosen/visited flag)
    texts: tuple[tuple[str, str, bool], ...] = ()


def _clean(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


def _css_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _Element:
    __slots__ = ("name", "attrs", "kind", "parts")

    def __init__(self, name: str, attrs: dict[str, str]):
        self.name = name
        self.attrs = attrs
        self.kind = attrs.get("data-kind")  # set on clickable-looking elements (and the search button)
        # text collected below this element, where its text matters (clickables, the instruction, the JSON)
        self.parts: list[str] | None = [] if ("data-clickable" in attrs or "id" in attrs) else None


class _Reader(HTMLParser):
    """One pass over the page with the standard library's HTML tokenizer (the one BeautifulSoup's
    ``html.parser`` builder uses): a stack of open elements, the visible text nodes with the
    clickable element each belongs to, the clickables, the search form and the markers."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[_Element] = []
        self.texts: list[tuple[str, _Element | None]] = []
        self.clickables: list[_Element] = []
        self.marked: dict[str, _Element] = {}  # by id: instruction, reward-info
        self.body: dict[str, str] | None = None
        self.search_action: str | None = None
        self.has_search_bar = False
        self._buffer: list[str] = []

    # text runs end at any tag, comment or declaration (as in a DOM)
    def _flush(self) -> None:
        if not self._buffer:
            return
        raw = "".join(self._buffer)
        self._buffer = []
        parent = self.stack[-1] if self.stack else None
        for element in self.stack:
            if element.parts is not None:
                element.parts.append(raw)
        if parent is None or parent.name in _INVISIBLE_PARENTS:
            return
        text = _clean(raw)
        if text:
            owner = next((e for e in reversed(self.stack) if e.kind is not None), None)
            self.texts.append((text, owner))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._flush()
        element = _Element(tag, {name: value or "" for name, value in attrs})
        if tag == "body" and self.body is None:
            self.body = element.attrs
        if element.attrs.get("id") == "search_input":
            self.has_search_bar = True
            form = next((e for e in reversed(self.stack) if e.name == "form"), None)
            if form is not None and form.attrs.get("action"):
                self.search_action = form.attrs["action"]
        if "data-clickable" in element.attrs:
            self.clickables.append(element)
        if element.attrs.get("id") in ("instruction", "reward-info"):
            self.marked.setdefault(element.attrs["id"], element)
        if tag not in _VOID_ELEMENTS:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID_ELEMENTS:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        self._flush()
        for depth in range(len(self.stack) - 1, -1, -1):
            if self.stack[depth].name == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self._buffer.append(data)

    def handle_comment(self, data: str) -> None:
        self._flush()

    def handle_decl(self, decl: str) -> None:
        self._flush()

    def handle_pi(self, data: str) -> None:
        self._flush()

    def unknown_decl(self, data: str) -> None:
        self._flush()

    def close(self) -> None:
        super().close()
        self._flush()


def parse_page(html: str, url: str) -> Page:
    """Read a page served by ``site.py`` (or a browser's re-serialization of it)."""
    reader = _Reader()
    reader.feed(html)
    reader.close()
    body = reader.body or {}
    kind = body.get("data-page")
    if kind not in PAGE_KINDS:
        raise ValueError("not a WebShop page (its <body> has no known data-page)")

    clickables: dict[str, Clickable] = {}
    for element in reader.clickables:
        text = _clean("".join(element.parts or ())).lower()
        element_kind = element.kind or "button"
        if not text or element_kind not in CLICKABLE_KINDS:
            continue
        # a later element with the same text replaces an earlier one, keeping its place (as the original's dict)
        clickables[text] = Clickable(
            text=text,
            href=element.attrs.get("href", ""),
            selector=f"[data-clickable={_css_string(element.attrs['data-clickable'])}]",
            kind=element_kind,
        )

    marker = reader.marked.get("instruction")
    instruction = _clean("".join(marker.parts or ())) if marker is not None else ""

    reward = reward_info = None
    if kind == "done":
        script = reader.marked.get("reward-info")
        payload: Any = json.loads("".join(script.parts or ()) or "{}") if script is not None else {}
        if not isinstance(payload, dict):
            payload = {}
        reward = float(payload["reward"]) if payload.get("reward") is not None else None
        reward_info = payload.get("reward_info") if isinstance(payload.get("reward_info"), dict) else None
        instruction = instruction or str(payload.get("instruction", ""))

    options: dict[str, str] = {}
    if body.get("data-options"):
        try:
            value = json.loads(body["data-options"])
        except ValueError:
            value = {}
        if isinstance(value, dict):
            options = {str(k): str(v) for k, v in value.items()}

    texts = tuple(_text_node(text, owner) for text, owner in reader.texts)
    return Page(
        url=url,
        html=html,
        kind=kind,
        has_search_bar=reader.has_search_bar,
        search_action=reader.search_action,
        clickables=clickables,
        instruction=instruction,
        reward=reward,
        reward_info=reward_info,
        asin=body.get("data-asin") or None,
        options=options,
        texts=texts,
    )


def _text_node(text: str, owner: _Element | None) -> tuple[str, str, bool]:
    """A visible text as ``Page.texts`` holds it: (text, role, chosen). The role is the kind of
    the clickable element it belongs to, or ``"text"``; only a selected option is chosen."""
    if owner is None or owner.kind is None:  # _Reader gives only owners with a kind
        return text, "text", False
    return text, owner.kind, owner.kind == "option" and owner.attrs.get("data-selected") == "true"


def render_observation(page: Page, mode: str, visited_asins: Collection[str] = ()) -> str:
    """The observation of ``page`` in ``mode`` ("text", "text_rich" or "html")."""
    if mode == "html":
        return page.html
    if mode == "text":
        return " [SEP] ".join(text for text, _, _ in page.texts)
    if mode != "text_rich":
        raise ValueError(f"observation mode must be one of {OBSERVATION_MODES}, got {mode!r}")
    visited = {asin.upper() for asin in visited_asins}
    lines: list[str] = []
    clicked: list[str] = []
    for text, role, chosen in page.texts:
        if role in ("button", "submit"):
            lines.append(f"[button] {text} [button_]")
        elif role == "option":
            if chosen:
                lines.append(f"  [clicked button] {text} [clicked button_]")
                clicked.append(text)
            else:
                lines.append(f"  [button] {text} [button_]")
        elif role == "product":
            mark = "clicked button" if text.upper() in visited else "button"
            lines.append(f"\n[{mark}] {text} [{mark}_]")
        else:
            lines.append(text)
    observation = "".join(line + "\n" for line in lines)
    for text in clicked:  # each chosen option is announced on top, the last one first (as the original)
        observation = f"You have clicked {text}.\n" + observation
    return observation


__all__ = [
    "CLICKABLE_KINDS",
    "OBSERVATION_MODES",
    "PAGE_KINDS",
    "Clickable",
    "Page",
    "parse_page",
    "render_observation",
]
