#!/usr/bin/env bash
# vLLM's compile cache, carried from one GPU session to the next, so that an engine kind's first start on a fresh
# machine loads its compiled graphs instead of compiling them. On a fresh machine every engine kind's first start
# took 121-176 s (H100 2026-12-06, H200 2026-12-06), a second start of the same kind on the same machine 20-59 s;
# six cold starts are most of a session. vLLM keeps torch.compile's artefacts, Inductor's cache and Triton's under
# VLLM_CACHE_ROOT so that "users only need to copy the cache_dir to another machine to reuse the cache"
# (vllm/compilation/compiler_interface.py, InductorAdaptor.initialize_cache). gpu/stage.sh points VLLM_CACHE_ROOT,
# TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and CUDA_CACHE_PATH under SDLIB_COMPILE_CACHE (default /tmp/sdcache).
# A cache changes how long an engine takes to start, not what it computes: vLLM keys each entry by a hash of the
# engine's config and code and compiles afresh on a miss. One cache per card (gpu/card.sh).
#
#   bash gpu/cache.sh pack [MAX_FILES]   (on the machine, in a call of its own after the queue ended or stopped)
#       packs the cache folder into $OUT/cache.tar.xz.partNN (15 MiB each) + $OUT/CACHE.txt (card, sha256 of each
#       part, sizes); at most MAX_FILES files in all (default 8: what a call brings back); packs nothing when it
#       would need more, and says how big it is
#   bash gpu/cache.sh restore [DIR]      (on the machine, after `source gpu/stage.sh`, before the queue starts;
#       DIR default .gpucache) unpacks DIR/<card>/cache.tar.*.part* into the cache folder when every part named by
#       DIR/<card>/CACHE.txt is there with its sha256; says what it restored, or why nothing
#
# Here, after the session: copy the call's CACHE.txt and cache.tar.*.part* into .gpucache/<card>/ (ignored by git;
# `python3 gpu/carry.py` lists the call that carries it).
set -u
cache=${SDLIB_COMPILE_CACHE:-/tmp/sdcache}
cmd=${1:?usage: cache.sh pack [MAX_FILES] | restore [DIR]}
card=$(bash "$(dirname "$0")/card.sh")
part_bytes=$(( ${SDLIB_CACHE_PART_MIB:-15} * 1024 * 1024 ))  # SDLIB_CACHE_PART_MIB: smaller parts, for tests

case "$cmd" in
  pack)
    max_files=${2:-8}
    : "${OUT:?OUT, the folder that comes back, is not set}"
    if [ ! -d "$cache" ] || [ -z "$(ls -A "$cache" 2>/dev/null)" ]; then echo "cache: $cache is empty; nothing packed"; exit 0; fi
    tmp=$(mktemp -d)
    t0=$(date +%s)
    if command -v xz >/dev/null; then ext=tar.xz; tar -c --exclude=./.restored -C "$cache" . | xz -T0 -6 > "$tmp/cache.$ext"
    else ext=tar.gz; tar czf "$tmp/cache.$ext" --exclude=./.restored -C "$cache" .; fi
    size=$(stat -c %s "$tmp/cache.$ext")
    parts=$(( (size + part_bytes - 1) / part_bytes ))
    echo "cache: $(du -sh "$cache" | cut -f1) in $cache -> $size bytes ($ext, $(( $(date +%s) - t0 )) s), $parts part(s) of $(( part_bytes / 1024 / 1024 )) MiB"
    du -sh "$cache"/* 2>/dev/null | sed 's/^/cache:   /'
    if [ $(( parts + 1 )) -gt "$max_files" ]; then
      echo "cache: $parts parts + CACHE.txt are more than the $max_files files a call brings back; nothing packed"
      rm -rf "$tmp"; exit 3
    fi
    mkdir -p "$OUT"
    split -b "$part_bytes" -d "$tmp/cache.$ext" "$OUT/cache.$ext.part"
    {
      echo "# compile cache for $card ($ext), $size bytes, $(find "$cache" -type f | wc -l) files, packed $(date -u +%FT%TZ)"
      (cd "$OUT" && sha256sum cache.$ext.part*)
    } > "$OUT/CACHE.txt"
    rm -rf "$tmp"
    cat "$OUT/CACHE.txt"
    ;;
  restore)
    dir=${2:-.gpucache}/$card
    if [ -f "$cache/.restored" ]; then echo "cache: already restored ($(cat "$cache/.restored"))"; exit 0; fi
    if [ ! -f "$dir/CACHE.txt" ]; then echo "cache: no $dir/CACHE.txt: engines start cold on this $card"; exit 0; fi
    if ! (cd "$dir" && grep -v '^#' CACHE.txt | sha256sum -c --quiet -); then
      echo "cache: a part in $dir is missing or not its CACHE.txt's sha256; nothing restored"; exit 1
    fi
    mkdir -p "$cache"
    parts=$(grep -v '^#' "$dir/CACHE.txt" | awk -v d="$dir/" '{print d $2}')
    if head -1 "$dir/CACHE.txt" | grep -q '(tar.xz)'; then cat $parts | xz -d -T0 | tar -x -C "$cache"; else cat $parts | tar -xz -C "$cache"; fi || {
      echo "cache: unpack failed; removing the half-restored cache"; rm -rf "$cache"; exit 1; }
    head -1 "$dir/CACHE.txt" | sed 's/^# //' > "$cache/.restored"
    echo "cache: restored $(du -sh "$cache" | cut -f1), $(find "$cache" -type f | wc -l) files, from $dir ($(cat "$cache/.restored"))"
    ;;
  *) echo "cache: unknown command $cmd"; exit 2 ;;
esac
