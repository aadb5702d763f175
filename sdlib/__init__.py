"""sdlib: measure speculative decoding inside vLLM at real batch sizes.

Usage:
    python -m sdlib sweep configs/embedded_default.yaml   # run a sweep, write tables
    python -m sdlib models                               # build the embedded tiny models

Data flows one way: engine run -> tidy parquet tables (``data/``) -> notebooks -> ``figures/``.
"""

__version__ = "0.1.0"
