"""``sdlib train``: prepare the corpus, fit, check and describe the embedded models."""

from sdlib.models.train.core import main

__all__ = ["main"]
