#!/usr/bin/env bash
# The fastest reasonable shell script doing packhorse's hops, for benchmarks/run_benchmarks.py.
#
#   benchmarks/baseline.sh [options] SOURCE WORK
#
# SOURCE is a tree of <a>/<b>/... files (group depth 2, as packhorse's group_depth = 2);
# WORK is created and laid out like the benchmark's packhorse site folders:
#   WORK/sites/fyst/buffer      source site buffer (package tars under raw/, bundles under bundles/)
#   WORK/sites/{cologne,cornell}/buffer   destination buffers
#   WORK/sites/{cologne,cornell}/archive  long-term archives (raw/<a>/<b>.tar), what is left at the end
#
# Hops, with the same bytes written and read back as packhorse (see docs/benchmarks.md):
#   1. scan:     sha256 of every source file
#   2. package:  per <a>/<b> group `tar cf` into the source buffer; fsync; read back (sha256)
#   3. bundle:   package tars into bundle tars (split like packhorse: a bundle closes once it
#                reaches --bundle-target bytes); fsync; read back (sha256)
#   4. per destination, both destinations in parallel:
#        transfer: rsync (or cp) the bundles into the destination buffer (--fsync); read back and
#                  compare with the source bundles' sha256
#        unpack:   `tar xf` each bundle into the buffer; fsync; sha256 of every package tar,
#                  compared with the source buffer's
#        archive:  rsync (or cp) the package tars into the archive (--fsync); read back and compare
#   5. delete:   the buffers' copies (rm)
# Any verification mismatch or failed command exits non-zero.
#
# Options (or environment variables):
#   --hasher sha256sum|openssl   (HASHER)   hashing tool; default sha256sum. On CPUs with SHA
#                                           extensions `openssl dgst -sha256` is ~3.5x faster
#                                           than coreutils sha256sum (no SHA-NI in coreutils 9.1).
#   --jobs N                     (JOBS)     parallel hashing/tar jobs; default $(nproc)
#   --copier rsync|cp            (COPIER)   copy tool of the transfer and archive hops; default
#                                           rsync (-a --fsync); cp (+ sync FILE) is cheaper in CPU
#   --no-fsync                   (FSYNC=0)  skip the fsyncs (packhorse always fsyncs)
#   --bundle-target BYTES        (BUNDLE_TARGET) default 1073741824 (packhorse's default)
#   --timings                    (TIMINGS=1) print the seconds of every hop on stderr
set -euo pipefail

HASHER=${HASHER:-sha256sum}
JOBS=${JOBS:-$(nproc)}
FSYNC=${FSYNC:-1}
BUNDLE_TARGET=${BUNDLE_TARGET:-1073741824}
TIMINGS=${TIMINGS:-0}
COPIER=${COPIER:-rsync}

while [[ $# -gt 0 ]]; do
    case $1 in
        --hasher) HASHER=$2; shift 2 ;;
        --jobs) JOBS=$2; shift 2 ;;
        --copier) COPIER=$2; shift 2 ;;
        --no-fsync) FSYNC=0; shift ;;
        --bundle-target) BUNDLE_TARGET=$2; shift 2 ;;
        --timings) TIMINGS=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        -*) echo "baseline.sh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [[ $# -ne 2 ]]; then
    echo "usage: baseline.sh [options] SOURCE WORK" >&2
    exit 2
fi
case $HASHER in sha256sum|openssl) ;; *) echo "baseline.sh: --hasher sha256sum|openssl" >&2; exit 2 ;; esac
case $COPIER in rsync|cp) ;; *) echo "baseline.sh: --copier rsync|cp" >&2; exit 2 ;; esac

SRC=$(realpath -e "$1")
WORK=$(realpath -m "$2")
SB=$WORK/sites/fyst/buffer
M=$WORK/manifests
DESTS=(cologne cornell)
export LC_ALL=C HASHER JOBS FSYNC

mkdir -p "$SB/raw" "$SB/bundles" "$M"
for d in "${DESTS[@]}"; do
    mkdir -p "$WORK/sites/$d/buffer/raw" "$WORK/sites/$d/buffer/bundles" "$WORK/sites/$d/archive/raw"
done

T0=$(date +%s.%N)
hop() {  # print the seconds since the previous hop
    [[ $TIMINGS == 1 ]] || return 0
    local now; now=$(date +%s.%N)
    awk -v a="$T0" -v b="$now" -v n="$1" 'BEGIN { printf "  %-10s %7.2f s\n", n, b - a }' >&2
    T0=$now
}

# hash_files: NUL-separated paths (relative to the current folder) on stdin ->
# "<sha256>  <path>" lines sorted by path. The list is cut into $JOBS slices hashed in
# parallel, each into its own file (parallel writers to one pipe would interleave lines).
hash_files() {
    local -a files pids=()
    mapfile -d '' files
    local n=${#files[@]} i tmp
    [[ $n -gt 0 ]] || return 0
    local per=$(( (n + JOBS - 1) / JOBS ))
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/baseline-hash.XXXXXX")
    for (( i = 0; i < n; i += per )); do
        if [[ $HASHER == openssl ]]; then
            printf '%s\0' "${files[@]:i:per}" | xargs -0 -r openssl dgst -sha256 -r > "$tmp/$i" &
        else
            printf '%s\0' "${files[@]:i:per}" | xargs -0 -r sha256sum > "$tmp/$i" &
        fi
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || { rm -rf "$tmp"; return 1; }; done
    if [[ $HASHER == openssl ]]; then
        cat "$tmp"/* | sed 's/ \*/  /'
    else
        cat "$tmp"/*
    fi | sort -k2
    rm -rf "$tmp"
}

# check MANIFEST DIR: re-read every file MANIFEST names under DIR and compare.
check() {
    local manifest=$1 dir=$2
    if ! (cd "$dir" && cut -c67- "$manifest" | tr '\n' '\0' | hash_files) | cmp -s - "$manifest"; then
        echo "baseline.sh: verification FAILED in $dir (against $manifest)" >&2
        exit 1
    fi
}

# fsync_files: fsync the NUL-separated paths on stdin (coreutils `sync FILE...`).
fsync_files() {
    [[ $FSYNC == 1 ]] || { cat >/dev/null; return 0; }
    xargs -0 -r sync --
}
RSYNC_OPTS=(-a)
[[ $FSYNC == 1 ]] && RSYNC_OPTS+=(--fsync)

# copy_tree FROM TO: copy the contents of folder FROM into folder TO (durably)
copy_tree() {
    if [[ $COPIER == rsync ]]; then
        rsync "${RSYNC_OPTS[@]}" "$1/" "$2/"
    else
        cp -a "$1/." "$2/"
        (cd "$2" && find . -type f -printf '%P\0' | fsync_files)
    fi
}

# 1. scan
(cd "$SRC" && find . -type f -printf '%P\0' | hash_files) > "$M/source.sha256"
hop scan

# 2. packages: one tar per <a>/<b> group, built $JOBS at a time
pack_one() {
    local g=$1
    mkdir -p "$SB/raw/$(dirname "$g")"
    tar cf "$SB/raw/$g.tar" -C "$SRC" "$g"
    printf '%s\0' "$SB/raw/$g.tar" | fsync_files
}
export -f pack_one fsync_files
export SRC SB
(cd "$SRC" && find . -mindepth 2 -maxdepth 2 -type d -printf '%P\0') | sort -z > "$M/groups"
xargs -0 -r -P "$JOBS" -n 1 bash -c 'pack_one "$1"' _ < "$M/groups"
(cd "$SB/raw" && tr '\0' '\n' < "$M/groups" | sed 's/$/.tar/' | tr '\n' '\0' | hash_files) > "$M/packages.sha256"
hop package

# 3. bundles: package tars in name order, a bundle closes once it reaches BUNDLE_TARGET bytes
bundle=0 size=0
: > "$M/bundle-0.list"
while IFS= read -r -d '' g; do
    printf '%s.tar\0' "$g" >> "$M/bundle-$bundle.list"
    size=$(( size + $(stat -c %s "$SB/raw/$g.tar") ))
    if (( size >= BUNDLE_TARGET )); then
        bundle=$(( bundle + 1 )) size=0
        : > "$M/bundle-$bundle.list"
    fi
done < "$M/groups"
[[ -s $M/bundle-$bundle.list ]] || rm "$M/bundle-$bundle.list"
pids=()
for list in "$M"/bundle-*.list; do
    b=$(basename "$list" .list)
    ( tar cf "$SB/bundles/$b.tar" -C "$SB/raw" --null -T "$list"
      printf '%s\0' "$SB/bundles/$b.tar" | fsync_files ) &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
(cd "$SB/bundles" && find . -name '*.tar' -printf '%P\0' | hash_files) > "$M/bundles.sha256"
hop bundle

# 4. transfer, unpack, archive: each destination in its own process
destination() {
    local d=$1
    local DB=$WORK/sites/$d/buffer DA=$WORK/sites/$d/archive
    copy_tree "$SB/bundles" "$DB/bundles"
    check "$M/bundles.sha256" "$DB/bundles"
    for b in "$DB"/bundles/*.tar; do
        tar xf "$b" -C "$DB/raw"
    done
    (cd "$DB/raw" && find . -type f -printf '%P\0' | fsync_files)
    check "$M/packages.sha256" "$DB/raw"
    copy_tree "$DB/raw" "$DA/raw"
    check "$M/packages.sha256" "$DA/raw"
}
pids=()
for d in "${DESTS[@]}"; do
    destination "$d" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
hop destinations

# 5. delete the buffer copies
rm -rf "$SB/raw" "$SB/bundles"
for d in "${DESTS[@]}"; do
    rm -rf "$WORK/sites/$d/buffer/raw" "$WORK/sites/$d/buffer/bundles"
done
hop delete
