#!/usr/bin/env bash
# Build .raywhl/raysite.tar.xz, the Ray that gpu/run_h200_c.sh carries to the H200 (no network there; the image
# lacks ray and jsonschema). Run here (needs PyPI): about a minute. The ray 2.60.0 wheel is 79 MB, over what one
# `run` call carries beside the checkout, so it is unpacked, its Java jar (ray/jars, 32 MB; only Ray's Java
# workers use it) and the dashboard's source maps are dropped, and the rest packed with xz: 31.8 MB, 164 MB
# unpacked. jsonschema and the three packages it needs are the ones the image lacks (gpu/image_packages.txt).
#   bash gpu/build_ray_carry.sh        -> .raywhl/raysite.tar.xz (ignored through .git/info/exclude)
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.raywhl/' .git/info/exclude 2>/dev/null || echo /.raywhl/ >> .git/info/exclude
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$tmp/w" \
  ray==2.60.0 jsonschema==4.25.1 referencing==0.37.0 jsonschema-specifications==2025.9.1 rpds-py==0.28.0
mkdir -p "$tmp/site" .raywhl
for w in "$tmp"/w/*.whl; do (cd "$tmp/site" && python3 -m zipfile -e "$w" .); done
rm -rf "$tmp/site/ray/jars" "$tmp"/site/ray/dashboard/client/build/static/js/*.map
tar cf - -C "$tmp/site" . | xz -6 -T2 > .raywhl/raysite.tar.xz
ls -l .raywhl/raysite.tar.xz
