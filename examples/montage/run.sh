#!/usr/bin/env bash
# Run the Montage mosaic workflow (montage.sh) on Kestrel and time it.
#
#   examples/montage/run.sh WORKDIR [--mode local|store] [--workers 4] [--slots 2] [--server-dir DIR]
#
# WORKDIR/raw/*.fits are the tiles (`testsupport/montage/make-tiles.py WORKDIR --grid 6`)
# and WORKDIR is the store. The mosaic is written to the store as kestrel-MODE/mosaic.fits, so
# WORKDIR/kestrel-MODE/mosaic.fits, beside run-serial.sh's WORKDIR/serial/mosaic.fits.
#   --mode local   (default) files between stages stay in the workers' caches (Kestrel's
#                  intermediate data); only the raw tiles and the mosaic cross the store
#   --mode store   every file between stages is written to the store and read back from it
# It starts a server and the workers on 127.0.0.1, and stops them at the end. With --server-dir it
# uses that server and its workers instead (their store must hold raw/ as WORKDIR does; for store
# mode, start the workers with `--cache-size 0` so that every read goes to the store).
# Needs Montage (Debian: apt-get install montage montage-gridtools) and a built kestrel (on PATH,
# $KESTREL, or target/release/kestrel).
set -euo pipefail
usage() { sed -n '4p' "$0" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 1 ] || usage
W=$(cd "$1" && pwd); shift
MODE=local WORKERS=4 SLOTS=2 SRV=
while [ $# -gt 0 ]; do
  case $1 in
    --mode) MODE=$2 ;;
    --workers) WORKERS=$2 ;;
    --slots) SLOTS=$2 ;;
    --server-dir) SRV=$(cd "$2" && pwd) ;;
    *) usage ;;
  esac
  shift 2
done
case $MODE in
  local) KEEP=local CACHE=4G ;;
  store) KEEP=persist CACHE=0 ;;
  *) usage ;;
esac
KESTREL=${KESTREL:-$(command -v kestrel || echo "$HERE/../../target/release/kestrel")}
KESTREL=$(cd "$(dirname "$KESTREL")" && pwd)/$(basename "$KESTREL")
[ -x "$KESTREL" ] || { echo "run.sh: no kestrel binary ($KESTREL); cargo build --release" >&2; exit 2; }

# The tasks' working directory: they write their outputs there for the worker to collect.
RUN=$(mktemp -d "${TMPDIR:-/tmp}/kestrel-montage.XXXXXX")
PIDS=()
stop() {
  local status=$?
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait
  if [ "$status" = 0 ]; then rm -rf "$RUN"; else echo "run.sh: logs kept in $RUN" >&2; fi
}
trap stop EXIT
k() { "$KESTREL" --server-dir "$SRV" "$@"; }
if [ -z "$SRV" ]; then
  SRV=$RUN/server
  "$KESTREL" --server-dir "$SRV" server start --host 127.0.0.1 --no-journal --store "$W" \
    --policy good-cache-compute > "$RUN/server.log" 2>&1 &
  PIDS+=($!)
  until [ -f "$SRV/access.json" ]; do
    kill -0 "${PIDS[0]}" 2>/dev/null || { cat "$RUN/server.log" >&2; exit 1; }
    sleep 0.1
  done
  for i in $(seq "$WORKERS"); do
    "$KESTREL" --server-dir "$SRV" worker start --slots "$SLOTS" --cache-size "$CACHE" \
      --cache-dir "$RUN/cache-$i" > "$RUN/worker-$i.log" 2>&1 &
    PIDS+=($!)
  done
  waited=0
  until [ "$(k worker list --output json | grep -c '"slots"')" -ge "$WORKERS" ]; do
    for p in "${PIDS[@]:1}"; do
      kill -0 "$p" 2>/dev/null || { cat "$RUN"/worker-*.log >&2; exit 1; }
    done
    waited=$((waited + 1))
    [ "$waited" -lt 600 ] || { echo "run.sh: workers did not connect within 60 s" >&2; exit 1; }
    sleep 0.1
  done
fi

# The first stages; mOverlaps and mBgModel submit the rest when they know it.
tiles=$(cd "$W/raw" && ls -- *.fits | sed 's/\.fits$//' | sort -V)
rm -rf "$W/kestrel-$MODE"
cd "$RUN"
# shellcheck disable=SC2086  # one argument per tile
MONTAGE_NAME=kestrel-$MODE MONTAGE_KEEP=$KEEP KESTREL=$KESTREL "$HERE/montage.sh" plan $tiles \
  > montage.toml
t0=$(date +%s.%N)
status=0
k submit --file montage.toml --wait > submit.log 2>&1 || status=$?
t1=$(date +%s.%N)
if [ "$status" != 0 ]; then
  cat submit.log >&2
  k job list >&2
  cat "$RUN"/log/*.err >&2 2>/dev/null || true
  echo "run.sh: the workflow failed (status $status)" >&2
  exit 1
fi
echo "Kestrel Montage ($MODE): $(wc -w <<< "$tiles") tiles in $(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }") s;" \
  "mosaic $W/kestrel-$MODE/mosaic.fits"
