"""``pytest notebooks --nbmake``: the notebooks write their figures to a temporary folder, never to figures/
(only ``make notebooks`` / ``make figures`` write there)."""

import os
import tempfile


def pytest_configure(config):
    os.environ.setdefault("SDLIB_FIGURES_DIR", tempfile.mkdtemp(prefix="sdlib-nbmake-figures-"))
