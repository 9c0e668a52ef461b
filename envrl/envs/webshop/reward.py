"""WebShop's purchase reward (Yao et al., 2022), component by component.

The score of buying ``product`` with the chosen ``options`` at ``price`` for ``goal`` is::

    total = r_type * (n_att + n_opt + r_price) / (len(goal attributes) + len(goal options) + 1)

* ``r_type`` (:func:`type_reward`): is it the right kind of product? 1.0 when the product's query
  equals the goal's, or at least two levels of their category paths are shared, or more than
  a fifth of the goal title's nouns are in the product title; 0.5 when none of these holds;
  then 0.1 when under a tenth of the nouns are shared, and 0.0 when none is.
* ``n_att`` (:func:`attribute_reward`): goal attributes matched by a product attribute
  (token-set similarity > 85) or, failing that, found as a substring of the product's title,
  bullet points or description.
* ``n_opt`` (:func:`option_reward`): chosen options that match a goal option: exactly for the
  option names in ``EXACT_MATCH_OPTS`` ("size"), by token-set similarity > 85 for the others,
  and otherwise by being a substring of the title, bullet points or description. Values are
  colour-normalised first (:mod:`.normalize`).
* ``r_price``: the price is at most the goal's ``price_upper``.

Faithful quirks kept on purpose, because published numbers depend on them: ``title_score``
divides by the number of goal-title nouns *with repetitions*; ``n_opt`` counts chosen options,
so choosing options the goal does not name can push the total above 1.0 (see
:func:`get_reward`); ``r_price`` is a bool.

Similarity. The original calls ``thefuzz.fuzz.token_set_ratio`` (thefuzz 0.19/0.22), which
drops the code points 128-255, lowercases, replaces every non-alphanumeric character by a space,
trims, and returns ``int(round(score))``. :func:`similarity` does the same with rapidfuzz and
``rapidfuzz.utils.default_process``; the rounding matters at the threshold (85.4 -> 85, no match).

Nouns. The original tags titles with spaCy's ``en_core_web_lg`` and keeps NOUN/PROPN tokens.
When an English spaCy model is importable (``ENVRL_WEBSHOP_NOUNS`` = ``auto``, the default, or
``spacy``) it is used the same way; otherwise (or with ``ENVRL_WEBSHOP_NOUNS=approx``) an
approximation (:func:`approx_nouns`): split the title roughly as spaCy's tokenizer would
(punctuation, hyphens before letters or between digits, slashes, unit suffixes such as "64GB" -> "GB"), then keep
a token unless it has no letter (numbers), is a function word, is in a list of common
product-title adjectives/adverbs/verbs (including basic colour adjectives), or has an
adjective/adverb/participle suffix (-ly, -ous, -ful, -less, -able/-ible, -ive, -ed) and is not
a listed noun with that ending (table, bed, drive, ...). Words in -ing count as nouns
(gerunds in compounds: "Living Room", "Walking Shoes") except a list of -ing adjectives.
Title-case words are nouns unless a rule above says otherwise, as spaCy tends to tag them
PROPN. tests/test_webshop_reward.py measures its agreement with hand-labelled tags of real titles.
Both ways are deterministic; which one ran is :func:`noun_backend`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from rapidfuzz.fuzz import token_set_ratio
from rapidfuzz.utils import default_process

from envrl.envs.webshop.normalize import normalize_color

EXACT_MATCH_OPTS: tuple[str, ...] = ("size",)
PRICE_RANGE: tuple[float, ...] = tuple(10.0 * i for i in range(1, 100))
MATCH_THRESHOLD = 85  # a similarity must exceed this (strictly) to count as a match

# --------------------------------------------------------------------------- similarity

_DROP_LATIN1 = {code: None for code in range(128, 256)}


def _process(text: str) -> str:
    """thefuzz's ``full_process(force_ascii=True)``: drop U+0080..U+00FF, then rapidfuzz's default."""
    return default_process(str(text).translate(_DROP_LATIN1))


def similarity(a: str, b: str) -> int:
    """``thefuzz.fuzz.token_set_ratio(a, b)`` exactly: an int in 0..100 (0 if either side is empty)."""
    return int(round(token_set_ratio(_process(a), _process(b))))


# --------------------------------------------------------------------------- nouns

_FUNCTION_WORDS = frozenset(
    """
a about above across after again against all almost along also although always am among an and
another any anyone anything anyway are around as at be became because become been before being
below beside besides between beyond both but by can cannot could did do does doing done down
during each either else enough etc even ever every few for from further had has have having he
her here hers herself him himself his how however i if in into is it its itself just least less
many may me might mine more most much must my myself neither no nor not of off often on once one
only onto or other others our ours ourselves out over own per perhaps please quite rather really
same several she should since so some such than that the their theirs them themselves then there
therefore these they this those though through throughout thru thus to together too toward towards
under until unto up upon us very via was we well were what whatever when where whether which while
who whom whose why will with within without would yet you your yours yourself yourselves w/ w
two three four five six seven eight nine ten eleven twelve twenty thirty forty fifty hundred
thousand first second third
""".split()
)

# Title words that taggers read as adjectives, adverbs or verbs (lowercase).
_NOT_NOUNS = frozenset(
    """
new modern small large big mini little long short high low soft hard deep light heavy thin thick
natural organic pure fresh premium professional portable wireless waterproof durable comfortable
adjustable elegant sexy cute classic vintage rustic decorative casual slim extra super ultra sweet
hot cold warm cool dry wet fast quick easy simple multi full half double single triple round square
rectangular oval wide narrow tall clean clear smooth flat sturdy stylish compatible free best
perfect great good nice beautiful pretty lovely fancy luxury luxurious cozy convenient healthy
real original advanced basic standard universal various different special unique ideal reusable
breathable washable foldable stackable removable rechargeable upholstered antique reclaimed solid
tufted padded quilted stretchy lightweight heavyweight compact flexible stable strong sensitive
delicate fashionable versatile sleek rich active daily quality black white red blue green yellow
pink purple grey gray brown beige orange teal khaki turquoise violet maroon navy golden silver
ivory tan crimson burgundy dark bright pale multicolor colorful transparent plain striped floral
plaid leopard matte glossy metallic wooden electric electronic digital acoustic optical magnetic
automatic manual mechanical ergonomic comfy stereo true fit made make keep see buy add get use
including include includes featuring features designed suitable available safe non anti pro plus
extended regular ready whole raw dried frozen roasted salted unsalted sugar-free gluten-free
vegan keto kosher halal crunchy creamy spicy mild sour salty savory juicy chewy tasty delicious
smart intelligent ultra-thin slimming shaping moisturizing amazing matching lasting charming
stunning soothing nourishing hydrating repairing clarifying volumizing sparkling relaxing
refreshing cleansing brightening whitening firming lifting anti-aging anti-slip non-slip
waterproofing everlasting outstanding
""".split()
)

_ING_NOT_NOUNS = frozenset(w for w in _NOT_NOUNS if w.endswith("ing"))

# Nouns with an adjective/participle ending.
_SUFFIX_NOUNS = frozenset(
    """
bed sofabed daybed shed seed speed feed need weed sled reed breed red bred
table cable vegetable turntable timetable notable stable
drive olive archive hive detective adhesive executive objective motive
supply family assembly jelly belly fly butterfly dragonfly lily holly bully rally ally jewelry
jewellery pantry poetry
glass class brass grass mass pass bass boss dress press chess moss loss kiss gloss
bus plus campus cactus virus fungus hummus octopus status lotus focus bonus
""".split()
)

_ADJ_SUFFIXES = ("ly", "ous", "ful", "less", "able", "ible", "ive", "ed")

# Unit suffixes spaCy's tokenizer splits off a number ("64GB" -> "64", "GB").
_UNITS = frozenset("km m dm cm mm nm yd in ft kg g mg lb oz mph mb kb gb tb".split())

_SPLIT = re.compile(r"[\s/,()\[\]{}\"“”;:!?|*+&★•]+")
_HYPHEN_SPLIT = re.compile(r"-(?=[^\W\d_])|(?<=\d)-(?=\d)")
_NUMBER_UNIT = re.compile(r"^\d+(?:\.\d+)?([a-z]+)$")
_EDGE = "'’.-–—_#%$@~`^=<>"


def title_tokens(title: str) -> list[str]:
    """Lowercased word tokens, split about where spaCy's English tokenizer splits them."""
    out: list[str] = []
    for chunk in _SPLIT.split(title.lower()):
        for piece in _HYPHEN_SPLIT.split(chunk):
            piece = piece.strip(_EDGE)
            for suffix in ("'s", "’s"):
                if piece.endswith(suffix):
                    piece = piece[: -len(suffix)]
            piece = piece.strip(_EDGE)
            if not piece:
                continue
            unit = _NUMBER_UNIT.match(piece)
            if unit and unit.group(1) in _UNITS:
                piece = unit.group(1)
            out.append(piece)
    return out


def _is_noun(token: str) -> bool:
    if not any(ch.isalpha() for ch in token):
        return False
    if token in _FUNCTION_WORDS or token in _NOT_NOUNS:
        return False
    if token in _SUFFIX_NOUNS:
        return True
    if token.endswith("ing"):
        return token not in _ING_NOT_NOUNS
    if len(token) > 4 and token.endswith(_ADJ_SUFFIXES):
        return False
    return True


def approx_nouns(title: str) -> list[str]:
    """The title's nouns by the documented approximation, lowercased, in order, with repeats."""
    return [t for t in title_tokens(title) if _is_noun(t)]


_SPACY_MODELS = ("en_core_web_lg", "en_core_web_md", "en_core_web_sm", "en_core_web_trf")
_spacy_lock = threading.Lock()
_spacy_state: dict[str, Any] = {}


def _spacy_pipeline() -> Any | None:
    """spaCy's English pipeline when one is installed (``en_core_web_lg`` preferred), else None.

    Checked with ``find_spec``, so that nothing imports spaCy (slow) when no model is there.
    """
    mode = os.environ.get("ENVRL_WEBSHOP_NOUNS", "auto").strip().lower()
    if mode == "approx":
        return None
    with _spacy_lock:
        if "nlp" not in _spacy_state:
            nlp = None
            for name in _SPACY_MODELS:
                if importlib.util.find_spec(name) is not None:
                    import spacy

                    nlp = spacy.load(name)
                    break
            _spacy_state["nlp"] = nlp
        nlp = _spacy_state["nlp"]
    if nlp is None and mode == "spacy":
        raise RuntimeError(
            f"ENVRL_WEBSHOP_NOUNS=spacy but no English spaCy model is installed (tried {', '.join(_SPACY_MODELS)})"
        )
    return nlp


def noun_backend() -> str:
    """``"spacy:<model>"`` or ``"approx"``: which way :func:`title_nouns` tags titles here."""
    nlp = _spacy_pipeline()
    return "approx" if nlp is None else f"spacy:{nlp.meta.get('lang')}_{nlp.meta.get('name')}"


@lru_cache(maxsize=200_000)
def _title_nouns_cached(title: str, backend: str) -> tuple[str, ...]:
    if backend == "approx":
        return tuple(approx_nouns(title))
    nlp = _spacy_pipeline()
    if nlp is None:  # ENVRL_WEBSHOP_NOUNS changed to "approx" since the backend was chosen
        raise RuntimeError("spaCy tagging was chosen for this title, but no spaCy pipeline is available now")
    return tuple(t.text.lower() for t in nlp(title) if t.pos_ in ("NOUN", "PROPN"))


def title_nouns(title: str) -> tuple[str, ...]:
    """The title's NOUN/PROPN tokens, lowercased, with repeats (spaCy or the approximation)."""
    return _title_nouns_cached(title, "approx" if _spacy_pipeline() is None else "spacy")


# --------------------------------------------------------------------------- components


def type_reward(product: Mapping[str, Any], goal: Mapping[str, Any]) -> dict[str, Any]:
    """``r_type`` with what decided it: ``query_match``, ``category_match``, ``title_score``."""
    query_match = product["query"] == goal["query"]
    product_path = {part.strip() for part in product["product_category"].split("›")}
    goal_path = {part.strip() for part in goal["product_category"].split("›")}
    category_match = len(product_path & goal_path) >= 2

    desired = title_nouns(goal["name"])
    bought = set(title_nouns(product["name"]))
    title_score = 0.2 if not desired else len(bought & set(desired)) / len(desired)

    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def _in_product_text(needle: str, product: Mapping[str, Any]) -> bool:
    """The fallback test: ``needle`` is a substring of the lowercased title, bullets or description."""
    return (
        needle in product["Title"].lower()
        or needle in " ".join(product["BulletPoints"]).lower()
        or needle in product["Description"].lower()
    )


def attribute_reward(product: Mapping[str, Any], goal: Mapping[str, Any]) -> tuple[float, int]:
    """``(r_att, n_att)``: the share and number of goal attributes the product has."""
    goal_attributes = goal["attributes"]
    matches = 0
    for wanted in goal_attributes:
        if any(similarity(have, wanted) > MATCH_THRESHOLD for have in product["Attributes"]):
            matches += 1
        elif _in_product_text(wanted, product):
            matches += 1
    return matches / len(goal_attributes), matches


def option_reward(
    product: Mapping[str, Any], goal_options: Sequence[str], chosen: Mapping[str, str]
) -> tuple[float | None, int]:
    """``(r_opt, n_opt)``; ``r_opt`` is None when the goal names no option.

    Every chosen option counts once if it matches: exactly (size), by similarity (others), or
    by appearing in the product's text.
    """
    wanted = [normalize_color(o) for o in goal_options]
    matches = 0
    for name, value in chosen.items():
        value = normalize_color(value)
        if name.lower() in EXACT_MATCH_OPTS:
            matched = value in wanted
        else:
            matched = any(similarity(option, value) > MATCH_THRESHOLD for option in wanted)
        if matched or _in_product_text(value, product):
            matches += 1
    return (matches / len(wanted) if wanted else None), matches


def goal_option_values(goal: Mapping[str, Any]) -> list[str]:
    """Goal options as a list of values (synthetic goals keep a name -> value dict)."""
    options = goal["goal_options"]
    return list(options.values()) if isinstance(options, Mapping) else list(options)


def get_reward(
    product: Mapping[str, Any], goal: Mapping[str, Any], price: float, options: Mapping[str, str]
) -> tuple[float, dict[str, Any]]:
    """The total reward and the original's verbose info for buying ``product``.

    Info keys: r_type, r_att, w_att, query_match, category_match, title_score, and r_option /
    w_option when the goal names options, r_price / w_price when the goal has a price bound.
    The total is not clipped: as in the original it can exceed 1.0 when more options are chosen
    than the goal names and they match.
    """
    type_info = type_reward(product, goal)
    r_price = (price <= goal["price_upper"]) if goal["price_upper"] > 0 else None
    r_att, n_att = attribute_reward(product, goal)
    r_option, n_opt = option_reward(product, goal_option_values(goal), options)

    denominator = len(goal["attributes"]) + len(goal["goal_options"]) + 1
    total = (n_att + n_opt + (r_price or 0)) / denominator * type_info["r_type"]

    info: dict[str, Any] = {
        "r_type": type_info["r_type"],
        "r_att": r_att,
        "w_att": len(goal["attributes"]) / denominator,
        "query_match": type_info["query_match"],
        "category_match": type_info["category_match"],
        "title_score": type_info["title_score"],
    }
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal["goal_options"]) / denominator
    if r_price is not None:
        info["r_price"] = r_price
        info["w_price"] = 1 / denominator
    return total, info


def nouns_of(titles: Iterable[str]) -> list[tuple[str, ...]]:
    """:func:`title_nouns` of many titles (a convenience for analyses and tests)."""
    return [title_nouns(t) for t in titles]
