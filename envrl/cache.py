"""Where envrl keeps what it generates: ``$ENVRL_CACHE/<engine>``, else ``~/.cache/envrl/<engine>``."""

from __future__ import annotations

import os
from pathlib import Path


def engine_cache(engine: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache folder of ``engine`` (``alfworld``, ``textworld``, ``webshop``); ``cache_dir`` overrides it."""
    if cache_dir is not None:
        return Path(cache_dir)
    base = os.environ.get("ENVRL_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "envrl") / engine
