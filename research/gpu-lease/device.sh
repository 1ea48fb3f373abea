#!/usr/bin/env bash
# A distillation phase on a lent GPU, one step per device call (docs/train.md, "On a
# lent GPU"). research/gpu-lease/pack.sh copies this to .gpurun/run.sh; each call carries that,
# .gpurun/kit.sha256 and one piece folder, and runs from the repo root there:
#
#   bash .gpurun/run.sh stash                 keep this call's piece in /tmp/w (calls follow
#                                             within 30 s, so the machine and its /tmp stay)
#   bash .gpurun/run.sh teacher               (with the last piece) check and unpack the kit to
#                                             /tmp/kit, cache MPNet's vectors of the corpus
#   bash .gpurun/run.sh train PRETRAIN_ARGS   disan pretrain from the carried student on the GPU,
#                                             then its best.pt in fp16, in 15 MB pieces: as many
#                                             as one reply holds, its sha256 and metrics to $OUT
#   bash .gpurun/run.sh scratch PRETRAIN_ARGS the same for a student from scratch (the args name
#                                             its size and --init; the kit's cache holds the
#                                             static word vectors of its vocabulary)
#   bash .gpurun/run.sh phase PRETRAIN_ARGS   a further phase from the best.pt of this machine's
#                                             last train/scratch/phase run (a warm machine keeps
#                                             $kit), so one lease chains phases without a new kit
#   bash .gpurun/run.sh fetch N...            pieces N... of what train or pieces split last, to $OUT
#   bash .gpurun/run.sh pieces FILE           FILE in pieces to $OUT, as train ends (tested here)
#   bash .gpurun/run.sh sentiment "0 1 2" ARGS [-- "3 4" ARGS2]...
#                                             (a kit of pack-sentiment.sh, with its last piece)
#                                             one `disan train --recipe sst5 ARGS` a seed, side by
#                                             side, a group of seeds a set of flags; all runs'
#                                             metrics and, best dev first, as many runs in fp16
#                                             pieces as the reply holds; KIT/FILE in ARGS is
#                                             a file of the kit (KIT/augmented.npz)
#   bash .gpurun/run.sh back FILE...          FILEs in pieces to $OUT while the reply holds them
#   bash .gpurun/run.sh student MINUTES ARGS  (a kit of pack-student.sh, with its last piece) the
#                                             teacher encodes the corpus for at most MINUTES (a
#                                             shuffled prefix: every source), then `disan distill
#                                             student ARGS` on it, its inputs read first (`--check`:
#                                             a bad flag or file stops before the teacher; KIT/init.pt in ARGS: the start
#                                             pack-student.sh --init put in the kit; KIT/data the
#                                             staged files of --data); student.pt
#                                             back in fp16 with its metrics, without a borrowed
#                                             word table (put back here: `python -m research slim
#                                             student16.pt OUT.pt --borrowed-from START.pt`)
#   bash .gpurun/run.sh static MINUTES EPOCHS
#                                             (a kit of pack-student.sh with PIECES.npy, with its
#                                             last piece) the teacher encodes the corpus for at most
#                                             MINUTES, then the kit's piece table trains as a static
#                                             encoder on every cached row for EPOCHS
#                                             (research.static_pieces --train): the best held-out
#                                             epoch's table replaces the kit's, the start of the
#                                             students that follow; back in fp16 with its map and
#                                             static.json (held-out cosine by epoch)
#   bash .gpurun/run.sh students MINUTES ARGS [-- ARGS2]...
#                                             the same with one student a set of ARGS, side by side
#                                             on the one GPU after the teacher (MINUTES 0: no more
#                                             teacher rows than the cache has); each back as
#                                             studentN-fp16.pt (N from 1, in the order given) with its
#                                             metrics-N.jsonl and the tail of its log, while the
#                                             reply holds them
#
# DEVICE=cpu runs the same steps on the CPU (the dry run of docs/train.md); KIT moves the
# kit's folder from /tmp/kit.
set -euo pipefail
step=$1; shift
dev=${DEVICE:-cuda}
mkdir -p /tmp/w
for d in .gpurun/q*; do [ -d "$d" ] && cp -n "$d"/* /tmp/w/ 2>/dev/null || true; done
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
kit=${KIT:-/tmp/kit}
export DISAN_CACHE_DIR=$kit/cache
# A reply brings back at most 8 files and 64 MiB: the sha256, the metrics and four pieces of 15 MB.
piece=15000000 per_reply=4

pieces() {  # $1 in pieces under $kit/back; the first $per_reply of them and its sha256 to $OUT
  rm -rf "$kit/back" && mkdir -p "$kit/back"
  split -b $piece -d -a 1 "$1" "$kit/back/$(basename "$1").part-"
  (cd "$(dirname "$1")" && sha256sum "$(basename "$1")") | tee "$OUT/$(basename "$1").sha256"
  ls "$kit/back"
  for p in $(ls "$kit/back" | head -$per_reply); do cp "$kit/back/$p" "$OUT/"; done
  left=$(ls "$kit/back" | tail -n +$((per_reply + 1)) | sed 's/.*part-//' | tr '\n' ' ')
  [ -z "$left" ] || echo "not in this reply: pieces $left(bash .gpurun/run.sh fetch $left)"
}

pretrain() {  # disan pretrain into a new run folder, then its best.pt back in fp16
  run=$(mktemp -d "$kit/run-XXXX")
  python3 -m disan.cli pretrain --corpus "$kit/corpus" --device "$dev" --data "$kit/data" \
    --out "$run" "$@"
  python3 -m research slim "$run/best.pt" "$kit/best16.pt"
  ln -sfn "$run" "$kit/last-run"  # what `phase` goes on from
  cp "$run/metrics.jsonl" "$OUT/"
  pieces "$kit/best16.pt"
}
unpack() {  # the kit's pieces in /tmp/w, checked and unpacked into $kit (once)
  [ -f "$kit/.unpacked" ] && return
  got=$(cat /tmp/w/kit.tar.xz.part-* | sha256sum | cut -d' ' -f1)
  [ "$got" = "$(cat .gpurun/kit.sha256)" ] || { echo "kit sha256 $got does not match"; exit 3; }
  mkdir -p "$kit" && cat /tmp/w/kit.tar.xz.part-* | xz -d -T0 | tar -x -C "$kit" --strip-components 1
  touch "$kit/.unpacked"
}

back() {  # checkpoints, best first: each in pieces to $OUT while one reply holds them (8 files,
  # 64 MiB, with what $OUT has already), their sha256 in one file ($SUMS, sentiment.sha256 unless
  # set); the rest named for `pieces`
  local f n size files bytes sums=${SUMS:-sentiment.sha256}
  files=$(( $(ls "$OUT" | wc -l) + 1 )); bytes=$(du -cb "$OUT" | tail -1 | cut -f1)
  for f in "$@"; do
    size=$(stat -c %s "$f"); n=$(( (size + piece - 1) / piece ))
    if [ $(( files + n )) -gt 8 ] || [ $(( bytes + size )) -gt $(( 63 * 1024 * 1024 )) ]; then
      echo "not in this reply: $f (bash .gpurun/run.sh pieces $f)"; continue
    fi
    split -b $piece -d -a 1 "$f" "$OUT/$(basename "$f").part-"
    (cd "$(dirname "$f")" && sha256sum "$(basename "$f")") | tee -a "$OUT/$sums"
    files=$(( files + n )); bytes=$(( bytes + size ))
  done
}

sentiment() {  # "SEEDS" TRAIN_ARGS [-- "SEEDS" TRAIN_ARGS]...: one `disan train --recipe sst5` a
  # seed, each group of seeds with its own flags, all side by side; every run's metrics in one file
  # (a reply holds 8 files), then the runs' best.pt in fp16, best dev first, as many as the reply
  # holds (dev as served picks among them back here)
  local seeds s failed=0 runs r slim=() args all=()
  # a new folder a call, as pretrain's: a warm machine keeps the runs of an earlier call in $kit,
  # which must neither be joined to this call's nor picked as its best
  runs=$(mktemp -d "$kit/sst5-XXXX")
  local soft=(); [ -f "$kit/soft.npz" ] && soft=(--soft-targets "$kit/soft.npz")
  local group=1 a
  for a in "$@"; do  # every group's seeds first: a run's folder is named by its seed alone
    if [ $group = 1 ]; then
      for s in $a; do
        case " ${all[*]} " in *" $s "*) echo "seed $s is in two groups: give each run its own seed"; exit 2 ;; esac
        all+=("$s")
      done
    fi
    group=0; [ "$a" = -- ] && group=1
  done
  while [ $# -gt 0 ]; do
    seeds=$1; shift; args=()
    # KIT/... in a flag's value is a file of the kit (e.g. --augmented KIT/augmented.npz)
    while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("${1/#KIT\//$kit/}"); shift; done
    [ $# -gt 0 ] && shift  # the --
    for s in $seeds; do
      python3 -m disan.cli train --recipe sst5 --data "$kit/data" --vocab "$kit/vocab.json" \
        "${soft[@]}" --device "$dev" --no-progress --seed "$s" --out "$runs/sst5-s$s" "${args[@]}" \
        > "$runs/sst5-s$s.log" 2>&1 &
    done
  done
  for p in $(jobs -p); do wait "$p" || failed=1; done
  for s in "${all[@]}"; do echo "seed $s: $(tail -n 1 "$runs/sst5-s$s.log")"; done
  [ $failed = 0 ] || echo "a run failed (its log above); the finished ones come back"
  mkdir -p "$kit/slim"
  for r in $(python3 research/gpu-lease/sentiment_runs.py "$OUT/sentiment-runs.jsonl" "$runs"/sst5-s*/metrics.jsonl); do
    python3 -m research slim "$r/best.pt" "$kit/slim/$(basename "$r").pt"
    slim+=("$kit/slim/$(basename "$r").pt")
  done
  echo "by dev, best first: ${slim[*]}"
  back "${slim[@]}"
  [ $failed = 0 ] || exit 4
}

corpus_teacher() {  # MINUTES: the teacher caches more of the kit's corpus, for at most MINUTES
  python3 -m disan.cli distill teacher --corpus "$kit/corpus" --teacher mpnet --device "$dev" \
    --batch-size 512 --max-minutes "$1"
}

student_run() {  # RUN ARGS...: `disan distill student` into RUN, from the kit's piece table if it
  # has one; KIT/... in ARGS is a file of the kit (KIT/init.pt)
  local run=$1 a args=()
  shift
  for a in "$@"; do args+=("${a/#KIT\//$kit/}"); done
  [ -f "$kit/cache/pieces.npy" ] && cp "$kit/cache/pieces.npy" "$run/pieces.npy"
  python3 -m disan.cli distill student --corpus "$kit/corpus" --device "$dev" --out "$run" "${args[@]}"
}

each_set() {  # FUNCTION ARGS [-- ARGS2]...: FUNCTION with each set of ARGS, in the order given
  local fn=$1 args=()
  shift
  while [ $# -gt 0 ]; do
    args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
    [ $# -gt 0 ] && shift  # the --
    "$fn" "${args[@]}"
  done
}

check_student() {  # ARGS: the set's inputs read (`--check`) before any teacher minute is spent, so a
  # start without its whitening map or a missing --data file stops here
  student_run "$(mktemp -d "$kit/check-XXXX")" "$@" --check
}

start_student() {  # ARGS: one student of students(), in the background (its n, run and runs)
  n=$((n + 1)); run=$(mktemp -d "$kit/student$n-XXXX"); runs+=("$run")
  student_run "$run" "$@" > "$run/log" 2>&1 &
}

students() {  # MINUTES ARGS [-- ARGS2]...: the teacher, then one student a set of ARGS at once
  local minutes=$1 run runs=() n=0 failed=0 p slim=()
  shift
  each_set check_student "$@"
  [ "$minutes" = 0 ] || corpus_teacher "$minutes"
  each_set start_student "$@"
  for p in $(jobs -p); do wait "$p" || failed=1; done
  n=0
  for run in "${runs[@]}"; do
    n=$((n + 1)); echo "student $n: $(tail -n 2 "$run/log")"
    cp "$run/metrics.jsonl" "$OUT/metrics-$n.jsonl" 2>/dev/null || true
    [ -f "$run/student.pt" ] || continue
    python3 -m research slim "$run/student.pt" "$kit/student${n}-fp16.pt" --without-borrowed
    slim+=("$kit/student${n}-fp16.pt")
  done
  SUMS=students.sha256 back "${slim[@]}"
  [ $failed = 0 ] || { echo "a student failed (its log's tail above)"; exit 4; }
}

case $step in
  stash)
    ls /tmp/w; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true ;;
  teacher)
    unpack
    python3 -m disan.cli teacher --corpus "$kit/corpus" --teacher mpnet --device "$dev" \
      --batch-size 512 "$@" ;;
  train)
    pretrain --init-from "$kit/student.pt" "$@" ;;
  scratch)
    pretrain "$@" ;;
  phase)
    [ -f "$kit/last-run/best.pt" ] || { echo "no earlier run in $kit to go on from: run train or scratch first"; exit 2; }
    pretrain --init-from "$(readlink -f "$kit/last-run")/best.pt" "$@" ;;
  fetch)
    for n in "$@"; do cp "$kit"/back/*.part-"$n" "$OUT/"; done ;;
  pieces)
    pieces "$1" ;;
  back)
    back "$@" ;;
  task-teacher)
    unpack
    python3 -m disan.cli task-teacher --recipe sst5 --data "$kit/data" --teacher mpnet \
      --train-file sst/sst5_phrases_train.jsonl.gz --device "$dev" --out "$kit/tt" "$@"
    cp "$kit/tt/soft.npz" "$kit/soft.npz" && cp "$kit/tt/soft.npz" "$kit/tt/teacher.json" "$OUT/" ;;
  sentiment)
    unpack
    sentiment "$@" ;;
  student)
    unpack
    minutes=$1; shift
    check_student "$@"
    corpus_teacher "$minutes"
    run=$(mktemp -d "$kit/student-XXXX")
    student_run "$run" "$@"
    # a start that reads whole words borrows a 112 MB table that never trains: it stays here
    python3 -m research slim "$run/student.pt" "$kit/student16.pt" --without-borrowed
    cp "$run/metrics.jsonl" "$OUT/"
    pieces "$kit/student16.pt" ;;
  students)
    unpack
    students "$@" ;;
  static)
    unpack
    [ -f "$kit/cache/pieces.npy" ] || { echo "the kit has no piece table: pack-student.sh CORPUS PIECES.npy"; exit 2; }
    corpus_teacher "$1"
    python3 -m research.static_pieces --table "$kit/cache/pieces.npy" --train "$kit/corpus" --epochs "$2" \
      --device "$dev" --save-table "$kit/cache/pieces.npy" --save-map "$kit/map.npy" --out "$OUT/static.json"
    python3 -c 'import sys, numpy as np, pathlib
for f in map(pathlib.Path, sys.argv[2:]): np.save(f"{sys.argv[1]}/{f.stem}-f16.npy", np.load(f).astype(np.float16))' \
      "$OUT" "$kit/cache/pieces.npy" "$kit/map.npy" ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
