#!/usr/bin/env bash
# vLLM's compile cache, carried from one GPU session to the next, so that an engine kind's first start on a fresh
# machine can load its compiled graphs instead of compiling them. First starts of each engine kind took 121-176 s
# on the 2026-12-06 H100 and H200 and 56-79 s on the 2026-12-05 H100 (also a fresh machine: the machines differ
# too); a second start of the same kind on the same machine took 20-59 s. How much of the gap the cache closes is
# measured by the first session that starts from a carried one (the provenance records every engine start).
# vLLM keeps torch.compile's artefacts, Inductor's cache and Triton's under VLLM_CACHE_ROOT so that "users only
# need to copy the cache_dir to another machine to reuse the cache" (vllm/compilation/compiler_interface.py,
# InductorAdaptor.initialize_cache); gpu/stage.sh points VLLM_CACHE_ROOT, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR
# and CUDA_CACHE_PATH under SDLIB_COMPILE_CACHE (default /tmp/sdcache). vLLM keys each entry by a hash of the
# engine's config and code and compiles afresh on a miss, so a cache is meant to change how long an engine takes
# to start, not what it runs; reuse has been reported to fail in some setups (vllm-project/vllm#24915). To run
# without it, carry none (gpu/carry.py without --cache), or set VLLM_DISABLE_COMPILE_CACHE=1. One cache per card
# (gpu/card.sh).
#
#   bash gpu/cache.sh pack [MAX_PARTS]   (on the machine, in a call of its own after the queue ended or stopped)
#       packs the cache folder into $OUT/cache.tar.xz.partNN (15 MiB each) + $OUT/CACHE.txt (card, sha256 of each
#       part). At most MAX_PARTS parts (default 3: what travels beside the staged checkout in one call, 64 MiB),
#       and no more than what $OUT still has room for (8 files, 64 MiB a call, counting what is already there);
#       packs nothing when the cache needs more, and says how big it is
#   bash gpu/cache.sh restore [DIR]      (on the machine, after `source gpu/stage.sh`, before the queue starts;
#       DIR default .gpucache) unpacks DIR/<card>/cache.tar.*.part* into the cache folder when every part named by
#       DIR/<card>/CACHE.txt is there with its sha256: into a temporary folder first, moved into place whole, the
#       marker written last; says what it restored, or why nothing (exit 1: nothing restored; engines start cold)
#
# Here, after the session: rm -rf .gpucache/<card>; mkdir -p .gpucache/<card>; copy the call's CACHE.txt and
# cache.tar.*.part* there (ignored by git; `python3 gpu/carry.py --cache <card>` lists the call that carries it).
set -u -o pipefail
cache=${SDLIB_COMPILE_CACHE:-/tmp/sdcache}
cmd=${1:?usage: cache.sh pack [MAX_PARTS] | restore [DIR]}
card=$(bash "$(dirname "$0")/card.sh")
mib=$((1024 * 1024))
part_bytes=$(( ${SDLIB_CACHE_PART_MIB:-15} * mib ))  # SDLIB_CACHE_PART_MIB: smaller parts, for tests

case "$cmd" in
  pack)
    max_parts=${2:-3}
    : "${OUT:?OUT, the folder that comes back, is not set}"
    if [ ! -d "$cache" ] || [ -z "$(ls -A "$cache" 2>/dev/null)" ]; then echo "cache: $cache is empty; nothing packed"; exit 0; fi
    mkdir -p "$OUT"
    # room left in what this call brings back: 8 files, 64 MiB (less 1 MiB for CACHE.txt and slack)
    have_files=$(find "$OUT" -type f | wc -l); have_bytes=$(find "$OUT" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}')
    room_files=$(( 8 - have_files - 1 )); room_bytes=$(( 64 * mib - have_bytes - mib ))
    tmp=$(mktemp -d)
    t0=$(date +%s)
    if command -v xz >/dev/null; then ext=tar.xz; tar -c --exclude=./.restored -C "$cache" . | xz -T0 -6 > "$tmp/cache.$ext"
    else ext=tar.gz; tar -cz --exclude=./.restored -C "$cache" . > "$tmp/cache.$ext"; fi
    if [ $? -ne 0 ]; then echo "cache: packing $cache failed; nothing packed"; rm -rf "$tmp"; exit 1; fi
    size=$(stat -c %s "$tmp/cache.$ext")
    parts=$(( (size + part_bytes - 1) / part_bytes ))
    echo "cache: $(du -sh "$cache" | cut -f1) in $cache -> $size bytes ($ext, $(( $(date +%s) - t0 )) s), $parts part(s) of $(( part_bytes / mib )) MiB"
    du -sh "$cache"/* 2>/dev/null | sed 's/^/cache:   /'
    if [ "$parts" -gt "$max_parts" ] || [ "$parts" -gt "$room_files" ] || [ "$size" -gt "$room_bytes" ]; then
      echo "cache: $parts part(s) ($size bytes) exceed what one call carries or brings back (at most $max_parts parts;" \
           "$room_files more files and $room_bytes bytes in \$OUT); nothing packed"
      rm -rf "$tmp"; exit 3
    fi
    if ! split -b "$part_bytes" -d "$tmp/cache.$ext" "$tmp/cache.$ext.part"; then
      echo "cache: split failed; nothing packed"; rm -rf "$tmp"; exit 1
    fi
    {
      echo "# compile cache for $card ($ext), $size bytes, $(find "$cache" -type f | wc -l) files, packed $(date -u +%FT%TZ)"
      (cd "$tmp" && sha256sum cache.$ext.part*)
    } > "$tmp/CACHE.txt" && mv "$tmp"/cache.$ext.part* "$OUT/" && mv "$tmp/CACHE.txt" "$OUT/" || {
      echo "cache: writing to $OUT failed"; rm -rf "$tmp"; exit 1; }
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
    parts=$(grep -v '^#' "$dir/CACHE.txt" | awk -v d="$dir/" '{print d $2}')
    tmp="$cache.restoring.$$"; rm -rf "$tmp"; mkdir -p "$tmp"
    if head -1 "$dir/CACHE.txt" | grep -q '(tar.xz)'; then cat $parts | xz -d -T0 | tar -x -C "$tmp"; else cat $parts | tar -xz -C "$tmp"; fi
    if [ $? -ne 0 ]; then echo "cache: unpack failed; nothing restored"; rm -rf "$tmp"; exit 1; fi
    if [ -d "$cache" ] && [ -n "$(ls -A "$cache" 2>/dev/null)" ]; then
      cp -an "$tmp/." "$cache/" && rm -rf "$tmp" || { echo "cache: merging into $cache failed"; rm -rf "$tmp"; exit 1; }
      how="merged into the cache this machine already had"
    else
      rm -rf "$cache" && mkdir -p "$(dirname "$cache")" && mv "$tmp" "$cache" || { echo "cache: moving into place failed"; rm -rf "$tmp"; exit 1; }
      how="moved into place"
    fi
    head -1 "$dir/CACHE.txt" | sed 's/^# //' > "$cache/.restored"
    echo "cache: restored $(du -sh "$cache" | cut -f1), $(find "$cache" -type f | wc -l) files, from $dir, $how ($(cat "$cache/.restored"))"
    ;;
  *) echo "cache: unknown command $cmd"; exit 2 ;;
esac
