"""The version check each integration makes when it is imported.

The libraries these adapters plug into are young and change their interfaces between releases
(TRL's ``environment_factory``, OpenEnv's server, verifiers' ``v1`` API), so each adapter names
the release range it was tested with and refuses any other when it is imported, with a message
that names the extra installing a supported release, rather than failing deep inside a run.
Only package metadata is read: the library itself is not imported here.
"""

from __future__ import annotations

from importlib import metadata


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (a PyPI name), or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def check_version(
    installed: str | None, supported: tuple[str, str], *, user: str, label: str, distribution: str, extra: str
) -> str:
    """``installed`` when it lies in ``supported`` (at least the first, below the second), else an
    ImportError in one sentence: ``user`` (the adapter module) needs ``label`` (the library's name
    in words) in that range, installed by ``pip install 'envrl[extra]'``."""
    from packaging.version import InvalidVersion, Version

    low, high = supported
    hint = f"pip install 'envrl[{extra}]'"
    if installed is None:
        raise ImportError(f"{user} needs {label} {low} or newer (below {high}): {hint}")
    try:
        version = Version(installed)
    except InvalidVersion:
        raise ImportError(f"{label} reports an unreadable version {installed!r}; {hint}") from None
    if not Version(low) <= version < Version(high):
        raise ImportError(
            f"{user} supports {label} >={low},<{high}, but {label} {installed} is installed: "
            f"{hint} (or pip install '{distribution}>={low},<{high}')"
        )
    return installed
