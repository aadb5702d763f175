"""Training the embedded tiny models (``sdlib train``; see :mod:`sdlib.commands.train`).

Modules, in the order data flows: ``presets`` (components, sizes, corpus plan),
``corpus`` + ``prepare`` (the tokenized corpus and held-out split), ``data``
(token windows), ``llama`` (target and draft: transformers' LlamaForCausalLM),
``modules`` (the EAGLE heads), ``objectives``, ``stage`` (one stage's loop),
``acceptance`` (offline estimate), ``trainer`` + ``fit`` (the four stages),
``export`` (folders, manifest, packing), ``cards`` (model cards, README),
``check`` (CPU vLLM), ``cli``; ``files`` holds small file helpers.
"""
