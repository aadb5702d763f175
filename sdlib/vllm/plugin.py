"""vLLM general plugin: registers sdlib's custom speculative method on vLLM >= 0.34 (a no-op before).

vLLM loads every ``vllm.general_plugins`` entry point in each of its processes (the API server, the engine
core, the workers). sdlib's pyproject declares ``sdlib = "sdlib.vllm.plugin:register"``; on the staged H200
stack, gpu/stage.sh writes the same entry point into the site folder. The method's config is registered by
qualified name, so nothing heavier than vLLM's speculator-config module is imported here.

Usage: nothing to call; ``register()`` runs when vLLM loads its plugins (or call it yourself in-process).
"""

from __future__ import annotations

#: The method name and its SpeculatorConfig (sdlib/vllm/speculator.py).
METHOD = "sdlib_custom"
CONFIG = "sdlib.vllm.speculator.SdlibCustomSpeculatorConfig"


def register() -> bool:
    """Register :data:`METHOD` if this vLLM takes out-of-tree speculators; True when registered."""
    try:
        # deferred: vllm takes seconds to import, and only this path needs it
        from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method
    except ImportError:  # vLLM < 0.34: custom_class takes sdlib's proposers directly
        return False
    register_speculative_method(METHOD, CONFIG)
    return True
