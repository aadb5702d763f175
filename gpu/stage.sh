# Source this at the start of EVERY call on the H200 machine, from the repository root:
#     source gpu/stage.sh [PARTS_DIR]          (PARTS_DIR: the carried folder, default .gpu34)
# Returns 0 when the vLLM 0.34 stack is ready (environment exported), 3 while parts are missing (the
# call then only stored what it carried), 1 on an error (a part whose sha256 is not the manifest's, a
# failed unpack). Resumable: parts that arrived are kept under /tmp/sdlib034/parts (sha-checked), so a
# call sends only what is missing; the machine keeps /tmp only while it stays warm (30 s after a call).
# Prints one line `staged N/M parts, missing: pNN ...` (names to re-send), then, once everything is there,
# unpacks the archive to /tmp/sdlib034/site (parallel xz) and says how long that took.
_sd_pd=${1:-.gpu34}
_sd_root=/tmp/sdlib034
mkdir -p "$_sd_root/parts"
_sd_t0=$(date +%s%N)
_sd_m="$_sd_pd/MANIFEST.txt"
[ -f "$_sd_m" ] && cp -f "$_sd_m" "$_sd_root/MANIFEST.txt"
_sd_m="$_sd_root/MANIFEST.txt"

# the environment every call needs (also while staging, so a failed call leaves nothing half-set)
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 \
       VLLM_USE_FLASHINFER_SAMPLER=0 \
       NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# compile caches in one folder, so that gpu/cache.sh can carry them to the next session's machine
export SDLIB_COMPILE_CACHE=${SDLIB_COMPILE_CACHE:-/tmp/sdcache}
export VLLM_CACHE_ROOT=$SDLIB_COMPILE_CACHE/vllm TRITON_CACHE_DIR=$SDLIB_COMPILE_CACHE/triton \
       TORCHINDUCTOR_CACHE_DIR=$SDLIB_COMPILE_CACHE/inductor CUDA_CACHE_PATH=$SDLIB_COMPILE_CACHE/nv
# VLLM_USE_FLASHINFER_SAMPLER=0: FlashInfer is not carried (flashinfer-python 0.7.3 is not on the registry);
# vLLM 0.34's sampler imports the FlashInfer backend unless this is 0 (v1/sample/ops/topk_topp_sampler.py:88).
# NCCL_NVLS_ENABLE=0 etc.: NVLink multicast stays off on these machines (/work/.library/device/KINDS.md).

_sd_status() {
  if [ ! -f "$_sd_m" ]; then echo "staged 0/? parts, missing: MANIFEST.txt (carry $_sd_pd/MANIFEST.txt)"; return 3; fi
  _sd_total=0; _sd_have=0; _sd_missing=""
  while read -r sha name size; do
    case "$sha" in \#*|"") continue;; esac
    _sd_total=$((_sd_total + 1))
    if [ -f "$_sd_root/parts/$name" ]; then _sd_have=$((_sd_have + 1)); else _sd_missing="$_sd_missing $name"; fi
  done < "$_sd_m"
  echo "staged $_sd_have/$_sd_total parts, missing:${_sd_missing:- none}"
  [ "$_sd_have" -eq "$_sd_total" ]
}

_sd_take() {  # copy the carried parts that belong to the manifest, each checked against its sha256
  [ -f "$_sd_m" ] || return 0
  while read -r sha name size; do
    case "$sha" in \#*|"") continue;; esac
    [ -f "$_sd_root/parts/$name" ] && continue
    [ -f "$_sd_pd/$name" ] || continue
    got=$(sha256sum "$_sd_pd/$name" | cut -d' ' -f1)
    if [ "$got" != "$sha" ]; then echo "stage: $name: sha256 $got is not the manifest's $sha: not kept"; _sd_bad=1; continue; fi
    cp "$_sd_pd/$name" "$_sd_root/parts/$name.tmp" && mv "$_sd_root/parts/$name.tmp" "$_sd_root/parts/$name"
  done < "$_sd_m"
}

_sd_main() {
  _sd_bad=0
  _sd_want=$(head -1 "$_sd_m" 2>/dev/null | sed -n 's/.*sha256 \([0-9a-f]*\).*/\1/p')
  if [ -n "$_sd_want" ] && [ "$(cat "$_sd_root/site/.complete" 2>/dev/null)" = "$_sd_want" ]; then
    echo "staged: /tmp/sdlib034/site ready (archive $(echo "$_sd_want" | cut -c1-12))"
  else
    _sd_take
    if ! _sd_status; then [ "$_sd_bad" = 1 ] && return 1; return 3; fi
    [ "$_sd_bad" = 1 ] && return 1
    echo "stage: all parts here; unpacking"
    rm -rf "$_sd_root/site" "$_sd_root/unpack"
    mkdir -p "$_sd_root/unpack"
    _sd_u0=$(date +%s%N)
    # parts in manifest order make one xz stream (64 MiB blocks: xz >= 5.4 decompresses them in parallel);
    # without xz, Python's lzma (one thread, slower)
    _sd_parts=$(grep -v '^#' "$_sd_m" | awk -v d="$_sd_root/parts/" '{print d $2}')
    if command -v xz >/dev/null; then
      _sd_how="xz $(xz --version | head -1 | awk '{print $NF}')"
      cat $_sd_parts | xz -d -T0 | tar -x -C "$_sd_root/unpack"
    else
      _sd_how="python lzma"
      cat $_sd_parts | python3 -c 'import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz").extractall(sys.argv[1])' "$_sd_root/unpack"
    fi
    if [ $? -ne 0 ] || [ ! -d "$_sd_root/unpack/site/vllm" ]; then echo "stage: unpack FAILED ($_sd_how)"; return 1; fi
    mv "$_sd_root/unpack/site" "$_sd_root/site" && rmdir "$_sd_root/unpack"
    # vLLM general plugin entry point, so that every vLLM process (engine core, workers) imports
    # sdlib.vllm.plugin:register (sdlib's custom speculative method on vLLM >= 0.34; a no-op before)
    mkdir -p "$_sd_root/site/sdlib_vllm_plugin-0.0.0.dist-info"
    printf 'Metadata-Version: 2.1\nName: sdlib-vllm-plugin\nVersion: 0.0.0\n' \
      > "$_sd_root/site/sdlib_vllm_plugin-0.0.0.dist-info/METADATA"
    printf '[vllm.general_plugins]\nsdlib = sdlib.vllm.plugin:register\n' \
      > "$_sd_root/site/sdlib_vllm_plugin-0.0.0.dist-info/entry_points.txt"
    echo "$_sd_want" > "$_sd_root/site/.complete"
    echo "stage: unpacked $(du -sh "$_sd_root/site" | cut -f1) to /tmp/sdlib034/site in $(( ($(date +%s%N) - _sd_u0) / 1000000 )) ms ($_sd_how)"
  fi
  # folders the carried wheels' .pth files would add (a .pth works only in a site directory, not on
  # PYTHONPATH): build_stack.py lists them in site/PYTHONPATH_EXTRA (the CuTe DSL's `cutlass` package)
  _sd_extra=""
  if [ -f "$_sd_root/site/PYTHONPATH_EXTRA" ]; then
    while read -r _sd_rel; do
      [ -n "$_sd_rel" ] && _sd_extra="$_sd_extra:$_sd_root/site/$_sd_rel"
    done < "$_sd_root/site/PYTHONPATH_EXTRA"
  fi
  export PYTHONPATH="$_sd_root/site$_sd_extra:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  export SDLIB_GPU_STACK="vllm-0.34 $_sd_root/site"
  echo "stage: environment ready (PYTHONPATH=$_sd_root/site$_sd_extra:$PWD); $(( ($(date +%s%N) - _sd_t0) / 1000000 )) ms in stage.sh"
  return 0
}
_sd_main
