#!/usr/bin/env bash
# A queue job's sweep on the config named after the machine's card (gpu/session.sh queues; run from the repository
# root): `bash gpu/card_sweep.sh STEM [sdlib sweep options]` runs configs/<card>_STEM.yaml, card = h200 when
# nvidia-smi names an H200, else h100, so an H100's cells never pool with an H200's (configs/h100_*.yaml extend
# the H200 configs and change only name and description). A sweep folder of that name already in data/sweeps (carried
# in, or committed) is copied into $RES first, so its done cells are skipped and the session adds the next ones; only
# when $RES has none yet: a second job on the same sweep in one session keeps what the first wrote (on 2026-12-06 the
# copy overwrote the session's provenance.json with the checkout's, dropping the first job's invocation).
set -eu
stem=${1:?usage: card_sweep.sh STEM [sdlib sweep options]}; shift
: "${RES:?RES, the results folder of the session, is not set}"
card=$(bash "$(dirname "$0")/card.sh")
name=${card}_${stem}
mkdir -p "$RES"
if [ -d "data/sweeps/$name" ] && [ ! -e "$RES/$name" ]; then cp -r "data/sweeps/$name" "$RES/"; fi
exec python3 -m sdlib sweep "configs/$name.yaml" --results-dir "$RES" "$@"
