"""Repository paths that never depend on the working directory.

Usage:
    from sdlib.paths import REPO_ROOT, DATA_DIR, FIGURES_DIR
"""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root (the folder that holds ``sdlib/``).
REPO_ROOT: Path = Path(__file__).resolve().parent.parent
#: Committed tables and reference data.
DATA_DIR: Path = REPO_ROOT / "data"
#: Figures written by the notebooks (PNG + SVG).
FIGURES_DIR: Path = REPO_ROOT / "figures"
#: Sweep configs (YAML) and papermill parameter files.
CONFIGS_DIR: Path = REPO_ROOT / "configs"
#: Generated, uncommitted artefacts (embedded models, executed notebooks).
CACHE_DIR: Path = Path(os.environ.get("SDLIB_CACHE_DIR", REPO_ROOT / ".cache"))
#: Where the embedded tiny models are built (``python -m sdlib models``).
MODELS_DIR: Path = CACHE_DIR / "models"
#: The trained embedded models (``sdlib train``), committed: ``@trained/<component>``.
TRAINED_MODELS_DIR: Path = DATA_DIR / "models"
#: Default results directory for sweeps: one folder per sweep.
SWEEPS_DIR: Path = DATA_DIR / "sweeps"


def resolve(path: str | os.PathLike[str]) -> Path:
    """Resolve ``path`` against the repo root when it is relative.

    ``@trained/target`` expands to the committed trained models (data/models),
    ``@models/target`` to the random-weight embedded models folder and ``@shapes/<name>``
    to the config-only paper-scale shapes (sdlib.models.shapes), so configs never carry
    absolute paths.
    """
    s = str(path)
    if s.startswith("@trained/"):
        return TRAINED_MODELS_DIR / s[len("@trained/"):]
    if s.startswith("@models/"):
        return MODELS_DIR / s[len("@models/"):]
    if s.startswith("@shapes/"):
        return CACHE_DIR / "shapes" / s[len("@shapes/"):]
    p = Path(s).expanduser()
    return p if p.is_absolute() else (REPO_ROOT / p)


def repo_relative(path: str | os.PathLike[str]) -> str:
    """``path`` relative to the repo root when it lies inside it (provenance carries no absolute paths)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def hf_hub_cache() -> Path:
    """The Hugging Face Hub cache folder (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ~/.cache/huggingface/hub)."""
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return Path(os.environ.get("HF_HUB_CACHE", home / "hub"))


def hub_repo_cache(repo_id: str) -> Path:
    """Where the Hub cache keeps ``repo_id`` (a model)."""
    return hf_hub_cache() / ("models--" + repo_id.replace("/", "--"))
