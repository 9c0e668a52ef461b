"""Colour normalisation of option values, as WebShop's reward applies it.

Before options are compared, WebShop maps every option value to the first base colour of a
fixed list that occurs in it as a substring ("black forest" -> "black", "violet lavender" ->
"lavender" because "lavender" comes earlier in the list), and leaves values without one as they
are. The list and its order are data that decide scores, so they are kept exactly as the
official ``web_agent_site/engine/normalize.py`` has them (alphabetical, with its quirks:
"dark", "light", "natural", "christmas", "skull" count as colours).
"""

from __future__ import annotations

COLOR_SET: tuple[str, ...] = (
    "alabaster",
    "apricot",
    "aqua",
    "ash",
    "asphalt",
    "azure",
    "banana",
    "beige",
    "black",
    "blue",
    "blush",
    "bordeaux",
    "bronze",
    "brown",
    "burgundy",
    "camel",
    "camo",
    "caramel",
    "champagne",
    "charcoal",
    "cheetah",
    "chestnut",
    "chocolate",
    "christmas",
    "coffee",
    "cognac",
    "copper",
    "coral",
    "cranberry",
    "cream",
    "crystal",
    "dark",
    "denim",
    "eggplant",
    "elephant",
    "espresso",
    "fuchsia",
    "gold",
    "granite",
    "grape",
    "graphite",
    "grass",
    "gray",
    "green",
    "grey",
    "heather",
    "indigo",
    "ivory",
    "ivy",
    "khaki",
    "lavender",
    "lemon",
    "leopard",
    "light",
    "lilac",
    "lime",
    "magenta",
    "maroon",
    "mauve",
    "merlot",
    "midnight",
    "mint",
    "mocha",
    "multicolor",
    "mushroom",
    "mustard",
    "natural",
    "navy",
    "nude",
    "olive",
    "orange",
    "peach",
    "pewter",
    "pink",
    "plum",
    "purple",
    "rainbow",
    "red",
    "rose",
    "royal",
    "rust",
    "sand",
    "sapphire",
    "seashell",
    "silver",
    "skull",
    "slate",
    "steel",
    "stone",
    "stonewash",
    "sunflower",
    "tan",
    "taupe",
    "teal",
    "tiger",
    "turquoise",
    "violet",
    "walnut",
    "wheat",
    "white",
    "wine",
    "yellow",
)


def normalize_color(value: str) -> str:
    """The first base colour (in ``COLOR_SET`` order) contained in ``value``, else ``value``.

    Case-sensitive, as the original: the engine lowercases option values when it loads them.
    """
    for color in COLOR_SET:
        if color in value:
            return color
    return value
