"""Products in the WebShop engine's schema, from the official files or the built-in catalog.

Both sources go through :func:`build_products`, which turns raw ``items_shuffle``-style records
(plus the ``items_ins_v2`` attribute file, the human instruction file and the reviews file) into
the dicts the original engine's ``load_products`` makes: ``asin, name, Title, category, query``
(lowercased, stripped), ``product_category, Description, BulletPoints, Reviews`` (each
``{title?, score, body}``), ``Rating, pricing`` (one or two floats, ``[100.0]`` when missing),
``Price`` (the original's tag: ``"$34.0"``, ``"$8.5 to $15.0"``, ``"$100.0"``), ``options``
(lowercased name -> values ``strip().replace('/', ' | ').lower()``), ``option_to_image``,
``Attributes`` (``["DUMMY_ATTR"]`` when the attribute file has none), ``MainImage``, and for
goals ``instructions`` (human) and ``instruction_text``/``instruction_attributes`` (synthetic).
Records whose asin is ``"nan"`` or longer than 10 characters, and repeated asins, are skipped.
The keys the original drops (brand, seller, availability, ...) are dropped too.

Official files, in ``data_dir`` or ``$WEBSHOP_DATA`` (the names the original's setup uses):
``items_shuffle_1000.json`` or ``items_shuffle.json`` (products), ``items_ins_v2_1000.json`` or
``items_ins_v2.json`` (attributes and synthetic instructions), ``items_human_ins.json`` (human
instructions; optional: without it goals are synthetic) and ``reviews.json`` (optional). The
``_1000`` pair is used when present, unless more than 1,000 products are asked for or
``full=True``. A missing or unreadable file raises :class:`WebShopDataError` saying which file
and what to do.

Prices. The original draws the price of a product with a price range with the global,
unseeded ``random.uniform`` at every start, so two runs (and train vs. test processes) see
different prices for the same goal. Here :func:`product_prices` draws them, in catalog order,
from ``random.Random(PRICE_SEED)``, whose stream Python keeps identical on every machine.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from envrl.envs.webshop import builtin
from envrl.envs.webshop.builtin import no_gc

PRICE_SEED = "envrl-webshop-product-prices-v1"

PRODUCT_FILES = ("items_shuffle_1000.json", "items_shuffle.json")
ATTRIBUTE_FILES = ("items_ins_v2_1000.json", "items_ins_v2.json")
HUMAN_FILE = "items_human_ins.json"
REVIEW_FILE = "reviews.json"

_DROPPED_KEYS = frozenset(
    (
        "product_information",
        "brand",
        "brand_url",
        "list_price",
        "availability_quantity",
        "availability_status",
        "total_reviews",
        "total_answered_questions",
        "seller_id",
        "seller_name",
        "fulfilled_by_amazon",
        "fast_track_message",
        "aplus_present",
        "small_description_old",
    )
)
_NOT_PRICE = re.compile(r"[^\d.]")


class WebShopDataError(RuntimeError):
    """The official WebShop files are missing or unreadable (the message says which and what to do)."""


# --------------------------------------------------------------------------- engine schema


def parse_pricing(pricing: Any) -> tuple[list[float], str]:
    """``(pricing, Price)`` from a raw ``pricing`` string, as the original engine reads it.

    Every ``$``-separated chunk, with all but digits and dots removed, is a price; one price
    gives ``"$<float>"``, two or more give ``"$<a> to $<b>"`` and keep the first two. Chunks
    that hold no number are skipped (the original would crash on them).
    """
    if not pricing:
        return [100.0], "$100.0"
    values: list[float] = []
    for chunk in str(pricing).split("$")[1:]:
        digits = _NOT_PRICE.sub("", chunk)
        try:
            values.append(float(digits))
        except ValueError:
            continue
    if not values:
        return [100.0], "$100.0"
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def _options(customization: Any) -> tuple[dict[str, list[str]], dict[str, Any]]:
    options: dict[str, list[str]] = {}
    option_to_image: dict[str, Any] = {}
    if not customization:
        return options, option_to_image
    for name, contents in customization.items():
        if contents is None:
            continue
        values = []
        for content in contents:
            value = content["value"].strip().replace("/", " | ").lower()
            values.append(value)
            option_to_image[value] = content.get("image")
        options[name.lower()] = values
    return options, option_to_image


def _reviews(raw: Sequence[Mapping[str, Any]] | None) -> tuple[dict[str, list], dict[str, Any]]:
    reviews: dict[str, list] = {}
    ratings: dict[str, Any] = {}
    for record in raw or ():
        reviews[record["asin"]] = record.get("reviews") or []
        ratings[record["asin"]] = record.get("average_rating", "N.A.")
    return reviews, ratings


def build_products(
    raw_products: Sequence[Mapping[str, Any]],
    attributes: Mapping[str, Mapping[str, Any]],
    human_instructions: Mapping[str, list] | None = None,
    reviews: Sequence[Mapping[str, Any]] | None = None,
    num_products: int | None = None,
) -> list[dict[str, Any]]:
    """Raw records -> engine-schema products, in file order (the first ``num_products`` records)."""
    all_reviews, all_ratings = _reviews(reviews)
    records = raw_products if num_products is None else raw_products[:num_products]
    products: list[dict[str, Any]] = []
    seen: set[str] = set()
    with no_gc():
        for raw in records:
            asin = raw["asin"]
            if asin == "nan" or len(asin) > 10 or asin in seen:
                continue
            seen.add(asin)
            p = dict(raw)
            for key in _DROPPED_KEYS.intersection(p):
                del p[key]
            p["query"] = str(raw["query"]).lower().strip()
            p["Title"] = raw["name"]
            p["Description"] = raw["full_description"]
            p["Reviews"] = [_review(r) for r in all_reviews.get(asin, [])]
            p["Rating"] = all_ratings.get(asin, "N.A.")
            bullets = raw["small_description"]
            p["BulletPoints"] = list(bullets) if isinstance(bullets, list) else [bullets]
            p["pricing"], p["Price"] = parse_pricing(raw.get("pricing"))
            p["options"], p["option_to_image"] = _options(raw.get("customization_options"))
            entry = attributes.get(asin) or {}
            p["Attributes"] = list(entry["attributes"]) if "attributes" in entry else ["DUMMY_ATTR"]
            p["instruction_text"] = entry.get("instruction")
            p["instruction_attributes"] = entry.get("instruction_attributes")
            if human_instructions is not None and asin in human_instructions:
                p["instructions"] = human_instructions[asin]
            images = raw.get("images") or [""]
            p["MainImage"] = images[0]
            products.append(p)
    return products


def _review(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``{title?, score, body}`` from a raw review with ``stars``/``score`` and ``review``."""
    review = {k: v for k, v in raw.items() if k not in ("stars", "review")}
    if "score" not in review:
        review["score"] = raw.get("stars")
    review["body"] = raw.get("review", "")  # as the original: no "review" -> empty body
    return review


def product_prices(products: Sequence[Mapping[str, Any]], seed: str = PRICE_SEED) -> dict[str, float]:
    """One price per product: its single price, or a seeded uniform draw in its price range."""
    rng = random.Random(seed)
    prices: dict[str, float] = {}
    for p in products:
        pricing = p["pricing"]
        if not pricing:
            prices[p["asin"]] = 100.0
        elif len(pricing) == 1:
            prices[p["asin"]] = pricing[0]
        else:
            prices[p["asin"]] = rng.uniform(pricing[0], pricing[1])
    return prices


# --------------------------------------------------------------------------- sources


@dataclass
class Catalog:
    """Products, their prices, and where they came from."""

    products: list[dict[str, Any]]
    prices: dict[str, float]
    source: str  # "builtin" or "official"
    human_goals: bool  # whether the human instruction file was loaded
    files: dict[str, str] = field(default_factory=dict)  # role -> path (official) or cache name

    @property
    def by_asin(self) -> dict[str, dict[str, Any]]:
        return {p["asin"]: p for p in self.products}


def _read_json(path: Path, role: str) -> Any:
    try:
        with no_gc(), open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise WebShopDataError(
            f"cannot read the WebShop {role} file {path}: {exc}. Re-download the official data "
            "(WebShop's setup.sh / the files linked from its README) into that folder, or unset "
            "WEBSHOP_DATA to use the built-in catalog."
        ) from exc


class OfficialFiles(TypedDict):
    """The official data files :func:`load_official` reads; the products and attributes must
    be there, the human instructions and reviews are used when present."""

    products: Path
    attributes: Path
    human: Path | None
    reviews: Path | None


def official_files(data_dir: str | os.PathLike, *, full: bool = False) -> OfficialFiles:
    """The official files to load from ``data_dir`` (``_1000`` pair unless ``full``).

    Raises :class:`WebShopDataError` when the products or attribute file is missing.
    """
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise WebShopDataError(
            f"WebShop data folder {folder} does not exist. Set WEBSHOP_DATA (or data_dir) to the "
            "folder holding items_shuffle_1000.json and items_ins_v2_1000.json (or the full "
            "items_shuffle.json and items_ins_v2.json), or unset it to use the built-in catalog."
        )
    order = (1, 0) if full else (0, 1)
    products = _required_file(folder, "products", [folder / PRODUCT_FILES[i] for i in order])
    attributes = _required_file(folder, "attributes", [folder / ATTRIBUTE_FILES[i] for i in order])
    # The product and attribute files must belong to the same setting.
    if products.name.endswith("_1000.json") != attributes.name.endswith("_1000.json"):
        raise WebShopDataError(
            f"WebShop files of different settings in {folder}: {products.name} with "
            f"{attributes.name}; provide both _1000 files or both full files."
        )
    human = folder / HUMAN_FILE
    reviews = folder / REVIEW_FILE
    return OfficialFiles(
        products=products,
        attributes=attributes,
        human=human if human.is_file() else None,
        reviews=reviews if reviews.is_file() else None,
    )


def _required_file(folder: Path, role: str, candidates: list[Path]) -> Path:
    """The first of ``candidates`` that exists (the preferred setting's file comes first)."""
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise WebShopDataError(
            f"WebShop {role} file missing in {folder}: expected {candidates[0].name}"
            f" or {candidates[1].name}. Download the official data (WebShop's setup.sh) into "
            "that folder, or unset WEBSHOP_DATA to use the built-in catalog."
        )
    return found


def load_official(data_dir: str | os.PathLike, num_products: int | None = None, *, full: bool | None = None) -> Catalog:
    """The official catalog; ``full`` None picks the full files when ``num_products`` > 1,000."""
    if full is None:
        full = num_products is not None and num_products > 1000
    files = official_files(data_dir, full=full)
    raw = _read_json(files["products"], "products")
    attributes = _read_json(files["attributes"], "attributes")
    human = _read_json(files["human"], "human instructions") if files["human"] else None
    reviews = _read_json(files["reviews"], "reviews") if files["reviews"] else None
    if not isinstance(raw, list) or not isinstance(attributes, dict):
        raise WebShopDataError(
            f"unexpected WebShop file format: {files['products']} must hold a list of products and "
            f"{files['attributes']} an object keyed by asin. Re-download the official files."
        )
    try:
        products = build_products(raw, attributes, human, reviews, num_products)
    except (KeyError, TypeError, AttributeError) as exc:
        raise WebShopDataError(
            f"malformed WebShop product record in {files['products']}: "
            f"missing or bad field {exc}. Re-download the official files."
        ) from exc
    return Catalog(
        products,
        product_prices(products),
        "official",
        human is not None,
        {k: str(v) for k, v in files.items() if v is not None},
    )


def load_builtin_catalog(num_products: int = builtin.DEFAULT_NUM_PRODUCTS) -> Catalog:
    """The built-in catalog (synthetic instructions only), through the same builder."""
    with no_gc():
        raw, attributes, reviews = builtin.load_builtin(num_products)
    products = build_products(raw, attributes, None, reviews)
    return Catalog(
        products, product_prices(products), "builtin", False, {"builtin": builtin.builtin_dir_name(num_products)}
    )
