#!/usr/bin/env bash
# The Montage mosaic workflow as Kestrel tasks: the command of each stage, and the job files that
# chain them. run.sh submits the first job file; mOverlaps and mBgModel write and submit the next
# ones at run time, when the number of overlaps (and so of mDiffFit tasks) is known.
#
#   montage.sh plan TILE...        print the job file of the first stages, for raw/TILE.fits in
#                                  the store (tiles in grid order: see "chunks" below)
#   montage.sh STAGE ARGS...       one task (the job files call these; see each function below)
#
# Environment, set in the first job file and passed on to the jobs that tasks submit:
#   MONTAGE_NAME  the folder of this run's logical files in the store (e.g. kestrel-local)
#   MONTAGE_KEEP  local: the files between stages stay in the workers' caches (Kestrel's
#                 intermediate data); persist: each is written to the store and read back from
#                 it. The mosaic is always persisted.
#   KESTREL       the kestrel binary tasks submit with (default: kestrel on PATH)
#
# Logical files, in $MONTAGE_NAME/: template.hdr; proj/T.fits, proj/T_area.fits and proj/T.tbl
# (the tile's line of the image table) per tile T; proj.tbl; diffs.tbl; diff/diff.I.J.fits
# (+ _area) and fits/fit.I.J.txt per overlapping pair I, J; corrections.tbl; corr/T.fits
# (+ _area); part/* (partial tables and mosaics, see "chunks"); mosaic.fits.
# A task finds its inputs where Kestrel staged them ({input:NAME}, $KESTREL_INPUTS; a staged
# file's path ends with its logical name), links them into a private directory where a Montage
# tool wants them side by side under their own names,
# and writes its outputs under their logical names in its working directory, where the worker
# collects them.
#
# Chunks: a Kestrel task declares at most 64 input files, and Montage's reductions read one or
# two files per tile or overlap (144 tiles, ~500 overlaps at G = 12). Each reduction is therefore
# a two-level tree: the same tool on chunks of at most 60 files (mImgtbl, mConcatFit, mAdd on a
# chunk of tiles, a chunk of consecutive tiles making a compact band of the sky), then one task
# over the partial results (tables concatenated; mAdd of the partial mosaics with their area
# files, which gives the area-weighted mean of all tiles again).
set -euo pipefail
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
N=${MONTAGE_NAME:-kestrel}
KEEP=${MONTAGE_KEEP:-local}
MAX=60

# Run a Montage tool quietly; on failure show what it said and fail the task.
q() {
  local out
  out=$("$@" 2>&1) || { echo "failed: $* -> $out" >&2; exit 1; }
  case "$out" in *'stat="ERROR"'*) echo "failed: $* -> $out" >&2; exit 1 ;; esac
}

# A private scratch directory $T, removed when the task ends.
scratch() { T=$(mktemp -d "${TMPDIR:-/tmp}/montage-task.XXXXXX"); trap 'rm -rf "$T"' EXIT; }

# Link each staged input whose name ends with SUFFIX into DIR, under its own base name.
link_inputs() {
  local dir=$1 suffix=$2 p
  mkdir -p "$dir"
  for p in $KESTREL_INPUTS; do
    case "$p" in *"$suffix") ln -sf "$p" "$dir/$(basename "$p")" ;; esac
  done
}

# The staged inputs whose names end with SUFFIX, one a line, in the order declared.
inputs_like() { local p; for p in $KESTREL_INPUTS; do case "$p" in *"$1") echo "$p" ;; esac; done; }

# cat_tables [--renumber] TABLE...: one Montage (IPAC) table holding the lines of all. The
# header lines are kept once, the widest (only the last column, the file name, varies in width);
# --renumber numbers the first column (cntr) 0, 1, ... again.
cat_tables() {
  local renumber=0
  [ "$1" = --renumber ] && { renumber=1; shift; }
  awk -v renumber=$renumber '
    FNR == 1 { header = 1; h = 0 }
    header && /^[\\|]/ { h++; if (length($0) > length(H[h])) H[h] = $0; if (h > nh) nh = h; next }
    { header = 0; body = body (renumber ? sprintf("%7d%s", n++, substr($0, 8)) : $0) "\n" }
    END { for (i = 1; i <= nh; i++) print H[i]; printf "%s", body }' "$@"
}

# chunks MAX ITEM...: the items, in order, as few lines of at most MAX as can be, of even sizes.
chunks() {
  local max=$1 i=0 line="" x
  shift
  [ $# -gt 0 ] || return 0
  local k=$((($# + max - 1) / max))
  local size=$((($# + k - 1) / k))
  for x in "$@"; do
    line="$line $x" i=$((i + 1))
    if [ $((i % size)) = 0 ]; then echo "${line# }"; line=""; fi
  done
  [ -z "$line" ] || echo "${line# }"
}

# A TOML list of strings: toml_list a b -> ["a", "b"]
toml_list() { local s="" x; for x in "$@"; do s="$s\"$x\", "; done; echo "[${s%, }]"; }

# The [defaults] of every job of the workflow: where tasks run and what they know.
defaults() {
  cat <<EOF
[defaults]
cwd = "$PWD"
stdout = "none"
stderr = "log/{job}-{task}.err"
env = { MONTAGE_NAME = "$N", MONTAGE_KEEP = "$KEEP", KESTREL = "${KESTREL:-kestrel}" }
EOF
}

# One job of one task: job NAME INPUTS OUTPUTS ARGS... (INPUTS, OUTPUTS: space-separated).
job() {
  local name=$1 inputs=$2 outputs=$3 args=("$SELF")
  shift 3
  args+=("$@")
  # shellcheck disable=SC2086  # the lists are split on purpose
  printf '\n[[job]]\nname = "%s"\ninputs = %s\noutputs = %s\ncommand = %s\n' "$name" \
    "$(toml_list $inputs)" "$(toml_list $outputs)" "$(toml_list "${args[@]}")"
}

plan() {
  local k=0 c t raw parts="" rows rowparts=""
  printf '%s\n' "$@" > tiles.txt
  defaults
  # mImgtbl over the raw tiles, chunk by chunk; mMakeHdr over the partial tables.
  while read -r c; do
    k=$((k + 1)) raw=""
    for t in $c; do raw="$raw raw/$t.fits"; done
    job "mImgtbl-raw.$k" "$raw" "$KEEP:$N/part/raw.$k.tbl" imgtbl "$N/part/raw.$k.tbl"
    parts="$parts $N/part/raw.$k.tbl"
  done < <(chunks $MAX "$@")
  job mMakeHdr "$parts" "$KEEP:$N/template.hdr" makehdr
  cat <<EOF

[[job]]
name = "mProjectPP"
each = "tiles.txt"
inputs = ["raw/{line}.fits", "$N/template.hdr"]
outputs = $(toml_list "$KEEP:$N/proj/{line}.fits" "$KEEP:$N/proj/{line}_area.fits" "$KEEP:$N/proj/{line}.tbl")
command = ["$SELF", "project", "{line}", "{input:raw/{line}.fits}", "{input:$N/template.hdr}"]
EOF
  # The image table of the projected tiles from their lines, chunk by chunk; then mOverlaps.
  k=0
  while read -r c; do
    k=$((k + 1)) rows=""
    for t in $c; do rows="$rows $N/proj/$t.tbl"; done
    job "mImgtbl-proj.$k" "$rows" "$KEEP:$N/part/proj.$k.tbl" cattbl "$N/part/proj.$k.tbl"
    rowparts="$rowparts $N/part/proj.$k.tbl"
  done < <(chunks $MAX "$@")
  job mOverlaps "$rowparts" "$KEEP:$N/proj.tbl $KEEP:$N/diffs.tbl" overlaps
}

# imgtbl OUT: mImgtbl over the staged images (their headers).
imgtbl() {
  scratch
  link_inputs "$T/img" .fits
  (cd "$T/img" && q mImgtbl . "$T/out.tbl")
  mkdir -p "$(dirname "$1")"
  mv "$T/out.tbl" "$1"
}

# cattbl OUT: the staged tables as one.
cattbl() { mkdir -p "$(dirname "$1")"; mapfile -t parts < <(inputs_like .tbl); cat_tables "${parts[@]}" > "$1"; }

# makehdr: mMakeHdr over the image table of the raw tiles: the header of the whole mosaic.
makehdr() {
  scratch
  mapfile -t parts < <(inputs_like .tbl)
  cat_tables --renumber "${parts[@]}" > "$T/raw.tbl"
  mkdir -p "$N"
  q mMakeHdr "$T/raw.tbl" "$N/template.hdr"
}

# project TILE RAW HDR: mProjectPP, the projected tile and its area file; and its line of the
# image table (mImgtbl reads only the FITS header: mOverlaps need not stage every tile).
project() {
  local t=$1
  scratch
  mkdir -p "$N/proj" "$T/one"
  q mProjectPP "$2" "$N/proj/$t.fits" "$3"
  ln -s "$PWD/$N/proj/$t.fits" "$T/one/$t.fits"
  (cd "$T/one" && q mImgtbl . "$T/one.tbl")
  mv "$T/one.tbl" "$N/proj/$t.tbl"
}

# overlaps: the image table of the projected tiles (cntr numbered afresh), mOverlaps; then the
# jobs that only now can be written: mDiffFit per overlapping pair, mConcatFit per chunk of their
# fits, and mBgModel.
overlaps() {
  scratch
  local c1 c2 plus minus c k=0 parts="" fits
  mapfile -t parts_in < <(inputs_like .tbl)
  mkdir -p "$N/jobs" "$T/dir"
  # The lines in the order `mImgtbl DIR` would give for a directory of the projected tiles, as
  # in run-serial.sh: the order the file system lists them in (`ls -f`). mBgModel's corrections
  # depend on the order of the images in their last digits; the same order, the same mosaic.
  cat_tables "${parts_in[@]}" > "$T/lines.tbl"
  awk '!/^[\\|]/ { print $NF }' "$T/lines.tbl" | (cd "$T/dir" && xargs touch)
  ls -f "$T/dir" > "$T/order.txt"
  awk 'NR == FNR { if (/^[\\|]/) print; else line[$NF] = $0; next }
       $1 in line { print line[$1] }' "$T/lines.tbl" "$T/order.txt" > "$T/ordered.tbl"
  cat_tables --renumber "$T/ordered.tbl" > "$N/proj.tbl"
  q mOverlaps "$N/proj.tbl" "$N/diffs.tbl"
  tail -n +3 "$N/diffs.tbl" | while read -r c1 c2 plus minus _; do
    echo "$c1 $c2 ${plus%.fits} ${minus%.fits}"
  done > "$N/jobs/pairs.txt"
  local P="$N/proj/{line:3}" M="$N/proj/{line:4}" I="{line:1}.{line:2}"
  {
    defaults
    cat <<EOF

[[job]]
name = "mDiffFit"
each = "$PWD/$N/jobs/pairs.txt"
inputs = $(toml_list "$P.fits" "${P}_area.fits" "$M.fits" "${M}_area.fits" "$N/template.hdr")
outputs = $(toml_list "$KEEP:$N/diff/diff.$I.fits" "$KEEP:$N/diff/diff.${I}_area.fits" "$KEEP:$N/fits/fit.$I.txt")
command = ["$SELF", "difffit", "$I", "{input:$P.fits}", "{input:${P}_area.fits}", "{input:$M.fits}", "{input:${M}_area.fits}", "{input:$N/template.hdr}"]
EOF
    while read -r c; do
      k=$((k + 1)) fits=""
      for pair in $c; do fits="$fits $N/fits/fit.$pair.txt"; done
      job "mConcatFit.$k" "$fits" "$KEEP:$N/part/fits.$k.tbl" concatfit "$N/part/fits.$k.tbl"
      parts="$parts $N/part/fits.$k.tbl"
    done < <(chunks $MAX $(awk '{ print $1 "." $2 }' "$N/jobs/pairs.txt"))
    job mBgModel "$N/proj.tbl $parts" "$KEEP:$N/corrections.tbl" bgmodel
  } > "$N/jobs/diff.toml"
  # Keyed by the submitting task: run again (retried, or re-run to remake lost files), it
  # submits nothing twice.
  "${KESTREL:-kestrel}" submit --key "$N-$KESTREL_JOB_ID-$KESTREL_TASK_ID-diff" \
    --file "$N/jobs/diff.toml" >/dev/null
}

# difffit I.J PLUS PLUS_AREA MINUS MINUS_AREA HDR: mDiffFit, the difference of two overlapping
# tiles and the plane fitted to it (the tool finds each tile's area file beside it).
difffit() {
  local id=$1
  scratch
  ln -s "$2" "$T/plus.fits"
  ln -s "$3" "$T/plus_area.fits"
  ln -s "$4" "$T/minus.fits"
  ln -s "$5" "$T/minus_area.fits"
  mkdir -p "$N/diff" "$N/fits"
  q mDiffFit -s "$N/fits/fit.$id.txt" "$T/plus.fits" "$T/minus.fits" "$N/diff/diff.$id.fits" "$6"
}

# concatfit OUT: mConcatFit over the staged fits (fit.I.J.txt), as one table.
concatfit() {
  scratch
  local f id
  link_inputs "$T/fits" .txt
  {
    printf "|%8s|%8s|%-40s|\n" cntr1 cntr2 stat
    printf "|%8s|%8s|%-40s|\n" int int char
    for f in $(inputs_like .txt); do
      id=$(basename "$f" .txt) id=${id#fit.}
      printf " %8s %8s %-40s \n" "${id%.*}" "${id#*.}" "$(basename "$f")"
    done
  } > "$T/statfiles.tbl"
  q mConcatFit "$T/statfiles.tbl" "$T/fits.tbl" "$T/fits"
  mkdir -p "$(dirname "$1")"
  mv "$T/fits.tbl" "$1"
}

# bgmodel: mBgModel, one background correction per tile; then the jobs of mBackground per tile,
# mAdd per chunk of corrected tiles, and the last mAdd.
bgmodel() {
  scratch
  local proj t c k=0 corr parts=""
  proj=$(inputs_like /proj.tbl)
  mapfile -t fits < <(inputs_like .tbl | grep -v '/proj\.tbl$')
  cat_tables "${fits[@]}" > "$T/fits.tbl"
  mkdir -p "$N/jobs"
  q mBgModel "$proj" "$T/fits.tbl" "$N/corrections.tbl"
  # The tiles, by the file names of the image table (its last column), in grid order.
  tail -n +4 "$proj" | awk '{ sub(/\.fits$/, "", $NF); print $NF }' | sort -V > "$N/jobs/tiles.txt"
  {
    defaults
    cat <<EOF

[[job]]
name = "mBackground"
each = "$PWD/$N/jobs/tiles.txt"
inputs = $(toml_list "$N/proj/{line}.fits" "$N/proj/{line}_area.fits" "$N/proj.tbl" "$N/corrections.tbl")
outputs = $(toml_list "$KEEP:$N/corr/{line}.fits" "$KEEP:$N/corr/{line}_area.fits")
command = ["$SELF", "background", "{line}", "{input:$N/proj/{line}.fits}", "{input:$N/proj/{line}_area.fits}", "{input:$N/proj.tbl}", "{input:$N/corrections.tbl}"]
EOF
    while read -r c; do
      k=$((k + 1)) corr=""
      for t in $c; do corr="$corr $N/corr/$t.fits $N/corr/${t}_area.fits"; done
      job "mAdd.$k" "$N/template.hdr $corr" \
        "$KEEP:$N/part/mosaic.$k.fits $KEEP:$N/part/mosaic.${k}_area.fits" \
        add "{input:$N/template.hdr}" "$N/part/mosaic.$k.fits"
      parts="$parts $N/part/mosaic.$k.fits $N/part/mosaic.${k}_area.fits"
    done < <(chunks $((MAX / 2)) $(< "$N/jobs/tiles.txt"))
    job mAdd "$N/template.hdr $parts" "persist:$N/mosaic.fits" \
      add "{input:$N/template.hdr}" "$N/mosaic.fits"
  } > "$N/jobs/background.toml"
  "${KESTREL:-kestrel}" submit --key "$N-$KESTREL_JOB_ID-$KESTREL_TASK_ID-background" \
    --file "$N/jobs/background.toml" >/dev/null
}

# background TILE IMAGE AREA PROJ_TBL CORRECTIONS: mBackground, the tile with its correction
# applied (the tool looks the tile up by file name in the image table, in its own directory).
background() {
  local t=$1
  scratch
  ln -s "$2" "$T/$t.fits"
  ln -s "$3" "$T/${t}_area.fits"
  mkdir -p "$N/corr"
  local out=$PWD/$N/corr/$t.fits
  (cd "$T" && q mBackground -t "$t.fits" "$out" "$4" "$5")
}

# add HDR OUT: mImgtbl and mAdd over the staged images and their area files; OUT_area.fits too
# if it is declared (a partial mosaic), else only OUT.
add() {
  scratch
  link_inputs "$T/img" .fits
  (cd "$T/img" && q mImgtbl . "$T/img.tbl")
  q mAdd -p "$T/img" "$T/img.tbl" "$1" "$T/out.fits"
  mkdir -p "$(dirname "$2")"
  mv "$T/out.fits" "$2"
  case "$2" in */part/*) mv "$T/out_area.fits" "${2%.fits}_area.fits" ;; esac
}

case "${1:-}" in
  plan | imgtbl | cattbl | makehdr | project | overlaps | difffit | concatfit | bgmodel | background | add)
    stage=$1
    shift
    "$stage" "$@"
    ;;
  *) sed -n '2,10p' "$0" >&2; exit 2 ;;
esac
