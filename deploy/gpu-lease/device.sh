#!/usr/bin/env bash
# A distillation phase on a lent GPU, one step per device call (docs/distillation.md, "5. On a
# lent GPU"). deploy/gpu-lease/pack.sh copies this to .gpurun/run.sh; each call carries that,
# .gpurun/kit.sha256 and one piece folder, and runs from the repo root there:
#
#   bash .gpurun/run.sh stash                 keep this call's piece in /tmp/w (calls follow
#                                             within 30 s, so the machine and its /tmp stay)
#   bash .gpurun/run.sh teacher               (with the last piece) check and unpack the kit to
#                                             /tmp/kit, cache MPNet's vectors of the corpus
#   bash .gpurun/run.sh train PRETRAIN_ARGS   disan pretrain from the carried student on the GPU,
#                                             then its best.pt in fp16, in <= 15 MB pieces: the
#                                             first six and metrics.jsonl to $OUT
#   bash .gpurun/run.sh fetch N...            pieces N... of that checkpoint to $OUT
#
# DEVICE=cpu runs the same steps on the CPU (the dry run of docs/distillation.md).
set -euo pipefail
step=$1; shift
dev=${DEVICE:-cuda}
mkdir -p /tmp/w
for d in .gpurun/q*; do [ -d "$d" ] && cp -n "$d"/* /tmp/w/ 2>/dev/null || true; done
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export DISAN_CACHE_DIR=/tmp/kit/cache
case $step in
  stash)
    ls /tmp/w; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true ;;
  teacher)
    if [ ! -d /tmp/kit ]; then
      got=$(cat /tmp/w/kit.tar.xz.part-* | sha256sum | cut -d' ' -f1)
      [ "$got" = "$(cat .gpurun/kit.sha256)" ] || { echo "kit sha256 $got does not match"; exit 3; }
      cat /tmp/w/kit.tar.xz.part-* | xz -d -T0 | tar -x -C /tmp
    fi
    python3 -m disan.cli teacher --corpus /tmp/kit/corpus --teacher mpnet --device "$dev" \
      --batch-size 512 "$@" ;;
  train)
    python3 -m disan.cli pretrain --corpus /tmp/kit/corpus --device "$dev" \
      --init-from /tmp/kit/student.pt --data /tmp/kit/data --out /tmp/kit/run "$@"
    python3 -m disan.cli slim /tmp/kit/run/best.pt /tmp/kit/best16.pt
    rm -rf /tmp/kit/back && mkdir -p /tmp/kit/back
    split -b 15000000 -d -a 1 /tmp/kit/best16.pt /tmp/kit/back/best16.pt.part-
    (cd /tmp/kit && sha256sum best16.pt) | tee "$OUT/best16.sha256"
    cp /tmp/kit/run/metrics.jsonl "$OUT/"
    ls /tmp/kit/back
    # a call gives back at most 8 files: the sha256, the metrics and six pieces (90 MB)
    for p in $(ls /tmp/kit/back | head -6); do cp "/tmp/kit/back/$p" "$OUT/"; done ;;
  fetch)
    for n in "$@"; do cp "/tmp/kit/back/best16.pt.part-$n" "$OUT/"; done ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
