"""The prompt templates the trainers ship (JSON data in this folder) and the one function that reads them.

Every kind of training template (world-model, inverse-dynamics and follow-up prompts,
:mod:`envrl.training.dynamics`; rationale prompts, :mod:`envrl.training.rationales`) is a JSON
object named either by a built-in name (a file here) or by a path. :func:`load_template` reads
either and checks that it is a JSON object; each kind then checks its own keys and fields. One
reader, so that a built-in template is found the same way in a source tree, a wheel or a zip,
and a broken file fails with the same one-line message whatever kind it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any


def template_file(file: str) -> Traversable:
    """A file of this folder (as the installed package holds it)."""
    return resources.files(__name__).joinpath(file)


def load_template(
    name_or_path: str | Path,
    *,
    builtins: Mapping[str, str],
    label: str,
    error: type[Exception] = ValueError,
) -> tuple[dict[str, Any], str]:
    """The JSON object of a template and where it came from (``builtin:NAME`` or the path).

    ``builtins`` maps the built-in names of the caller's kind to their files here; any other
    name is a path. ``label`` names the kind in messages (``world-model template``), and
    ``error`` is the caller's exception class, raised with one sentence for a name that is
    neither, a file that is not JSON or JSON that is not an object.
    """
    name = str(name_or_path)
    if name in builtins:
        text, source = template_file(builtins[name]).read_text(encoding="utf-8"), f"builtin:{name}"
    else:
        path = Path(name)
        if not path.is_file():
            raise error(f"unknown {label} {name!r}: not one of {', '.join(builtins)} and no such file")
        text, source = path.read_text(encoding="utf-8"), str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{label} {source} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise error(f"{label} {source} must be a JSON object")
    return data, source
