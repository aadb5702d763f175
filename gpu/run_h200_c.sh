#!/usr/bin/env bash
# One H200 call on vLLM 0.34 (2026-12-04, the third session: 575 s of device time in all), run after
# `source gpu/stage.sh .gpu34` in the call that carries the last part, so that staging and the work share the
# machine without an idle call. What it does, in the order the issues need it (each step keeps what it finished):
#
# 1. Ray on a GPU (issue 25's single-H200 check): `configs/h200_v034_hookoff.yaml` through `sdlib sweep
#    --executor ray` (Ray started on the machine, one engine group per task, num_gpus=1), which is also issue
#    23's n-gram zero-draft cost under the default CUDA graphs on 0.34 (no SD, n-gram K = 3 drafting K and
#    drafting nothing, bs 1 / 32 / 128, the 0.26 control's design). Ray is carried as .raywhl/raysite.tar.xz
#    (ray 2.60.0 without its Java jar and dashboard source maps, plus jsonschema and its three packages the
#    image lacks). A local `sdlib sweep` afterwards runs whatever cells Ray did not finish (done cells are
#    skipped), so a Ray failure costs the Ray attempt, not the measurement. Build the carry with
#    gpu/build_ray_carry.sh.
# 2. gpu/adaptive_ab_034.py (issue 23: does adaptive verification leave padded slots unverified; its cost
#    tables), bs 128 only, in the time left; it writes its JSON after every arm.
#
#   source gpu/stage.sh .gpu34 && SDLIB_GIT_COMMIT=<sha> DEADLINE_S=<s> bash gpu/run_h200_c.sh
# Results: $OUT/hookoff.tgz (the sweep folder), $OUT/ab/adaptive_ab_034.json, $OUT/run_c.log.
set -u
t0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-470}   # seconds from the start this script must end by (the call's limit less margin)
RES=/tmp/res
mkdir -p "$RES" /tmp/raysite "$OUT/ab"
left() { echo $(( DEADLINE_S - ($(date +%s) - t0) )); }
log() { echo "[run_c $(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/run_c.log"; }
log "commit ${SDLIB_GIT_COMMIT:-unset}; deadline ${DEADLINE_S}s"
if tar xJf .raywhl/raysite.tar.xz -C /tmp/raysite; then
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/raysite"   # after the stack's site: its packages win
  log "ray $(python3 -c 'import ray; print(ray.__version__)' 2>&1 | tail -1)"
fi
CFG=configs/h200_v034_hookoff.yaml
pack() { tar czf "$OUT/hookoff.tgz" -C "$RES" . 2>/dev/null; }
log "1. $CFG through --executor ray (limit $(( $(left) - 200 ))s)"
timeout -k 15 $(( $(left) - 200 )) python3 -m sdlib sweep "$CFG" --executor ray --results-dir "$RES" \
  > "$OUT/hookoff_ray.log" 2>&1
log "ray sweep rc=$?"; pack
if [ "$(left)" -gt 230 ]; then
  log "1b. the same config locally: cells Ray did not finish (limit $(( $(left) - 200 ))s)"
  timeout -k 15 $(( $(left) - 200 )) python3 -m sdlib sweep "$CFG" --results-dir "$RES" \
    > "$OUT/hookoff_local.log" 2>&1
  log "local sweep rc=$?"; pack
fi
log "2. adaptive verification A/B at bs 128 (limit $(( $(left) - 10 ))s)"
OUT="$OUT/ab" timeout -k 10 $(( $(left) - 10 )) python3 gpu/adaptive_ab_034.py --bs 128 --reps 3 \
  > "$OUT/ab/adaptive_ab.log" 2>&1
log "adaptive_ab rc=$?"
pack
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader >> "$OUT/run_c.log" 2>&1
ps -eo pid,cmd | grep -E "sdlib|vllm|raylet|gcs_server" | grep -v grep >> "$OUT/run_c.log"
log "end"
