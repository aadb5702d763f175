#!/usr/bin/env bash
# The machine's card as the configs and caches name it: h200 when nvidia-smi names an H200, else h100
# (SDLIB_CARD overrides, for tests). Used by gpu/card_sweep.sh and gpu/cache.sh.
if [ -n "${SDLIB_CARD:-}" ]; then echo "$SDLIB_CARD"; exit 0; fi
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200 && echo h200 || echo h100
