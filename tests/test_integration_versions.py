"""The version check every integration makes at import (envrl/integrations/versions.py).

Each adapter names the release range it was tested with; a missing library or one outside the
range stops the import with one sentence naming the extra to install, before the library itself
is imported (so a broken or old install cannot fail first, somewhere deep inside it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from envrl.integrations.versions import check_version

REPO = Path(__file__).resolve().parents[1]

#: adapter module, its distribution on PyPI, the library's name in messages, envrl's extra
ADAPTERS = [
    ("envrl.integrations.trl", "trl", "TRL", "trl"),
    ("envrl.integrations.openenv", "openenv-core", "openenv-core", "openenv"),
    ("envrl.integrations.verifiers", "verifiers", "verifiers", "verifiers"),
]


def test_the_check_names_the_extra_and_the_range():
    supported = ("1.2.0", "1.4.0")
    kwargs = {"user": "envrl.integrations.x", "label": "X", "distribution": "x-lib", "extra": "x"}
    assert check_version("1.2.0", supported, **kwargs) == "1.2.0"
    assert check_version("1.3.9", supported, **kwargs) == "1.3.9"
    cases = {
        None: "envrl.integrations.x needs X 1.2.0 or newer (below 1.4.0): pip install 'envrl[x]'",
        "1.1.9": "envrl.integrations.x supports X >=1.2.0,<1.4.0, but X 1.1.9 is installed: "
        "pip install 'envrl[x]' (or pip install 'x-lib>=1.2.0,<1.4.0')",
        "1.4.0": "but X 1.4.0 is installed",
        "not-a-version": "X reports an unreadable version 'not-a-version'; pip install 'envrl[x]'",
    }
    for installed, message in cases.items():
        with pytest.raises(ImportError) as caught:
            check_version(installed, supported, **kwargs)
        assert message in str(caught.value)


@pytest.mark.parametrize(("module", "distribution", "label", "extra"), ADAPTERS)
@pytest.mark.parametrize("fake", ["missing", "0.0.1"])
def test_importing_an_adapter_fails_with_one_clear_sentence(module, distribution, label, extra, fake):
    """In a fresh interpreter whose package metadata reports ``distribution`` missing or too old."""
    code = (
        "import importlib.metadata as m, sys\n"
        "real = m.version\n"
        "def version(name):\n"
        f"    if name != {distribution!r}: return real(name)\n"
        f"    if {fake!r} == 'missing': raise m.PackageNotFoundError(name)\n"
        f"    return {fake!r}\n"
        "m.version = version\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError as error:\n"
        f"    print(error); print({module.rsplit('.', 1)[1]!r} in sys.modules); sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 3, done.stderr
    expected = "or newer" if fake == "missing" else f"but {label} 0.0.1 is installed"
    assert expected in done.stdout and f"pip install 'envrl[{extra}]'" in done.stdout
    assert done.stdout.split()[-1] == "False"  # the library itself was never imported


def test_importing_envrl_imports_no_integration_library():
    code = "import sys, envrl, envrl.integrations; print([m in sys.modules for m in ('trl', 'openenv', 'verifiers', 'torch')])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.stdout.strip() == "[False, False, False, False]", done.stderr
