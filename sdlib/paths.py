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
#: Results of the committed sweeps (configs in ``configs/``): one folder per sweep.
SWEEPS_DIR: Path = DATA_DIR / "sweeps"
#: The folder beside a config outside ``configs/`` that holds its results: ``<config folder>/results/<name>/``.
RESULTS_FOLDER = "results"
#: The rule :func:`results_base` applies, in words (``--help`` texts and data/README.md say the same).
RESULTS_RULE = ("Results go to <base>/<name>/, where <base> is --results-dir (from the current folder) if given, "
                "else results_dir in the config (from the config's folder), else data/<kind>/ in the repository "
                "for a config in its configs/ folder (the committed results), else results/ beside the config.")


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


def results_base(config_file: "str | os.PathLike[str] | None" = None, results_dir: "str | None" = None,
                 kind: str = "sweeps") -> Path:
    """The folder that holds a sweep's results folder (``<base>/<name>/``): the one rule, :data:`RESULTS_RULE`.

    ``results_dir`` (the command line's ``--results-dir`` or the config's ``results_dir``, already resolved by
    the caller from where the user stands or from the config's folder) wins. Otherwise a config in the
    repository's ``configs/`` folder (or none: a config built in code) writes to ``data/<kind>/`` (the
    committed sweeps, which the notebooks read), and any other config to ``results/`` beside itself, so a
    study kept outside the repository never writes into it. ``kind``: ``sweeps`` or ``serving``.
    """
    if results_dir:
        return resolve(results_dir)
    if config_file is None:
        return DATA_DIR / kind
    f = Path(config_file).expanduser().resolve()
    try:
        f.relative_to(CONFIGS_DIR.resolve())
        return DATA_DIR / kind
    except ValueError:
        return f.parent / RESULTS_FOLDER


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
