"""Load a script of ``gpu/`` (tools run by hand, not part of the package) as a module, for its tests."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from sdlib.paths import REPO_ROOT


def load(name: str) -> ModuleType:
    """``gpu/<name>.py`` as a module named ``name``."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
