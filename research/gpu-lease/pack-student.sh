#!/usr/bin/env bash
# Pack what a lease for the subword-piece student needs (`device.sh student`) into carry-sized
# pieces. Run here, from the repo root:
#
#   research/gpu-lease/pack-student.sh [--init START.pt] CORPUS_DIR [PIECES.npy] [DATA_DIR]
#     START.pt    a checkpoint the run starts from (`disan distill student --init`; the shipped
#                 encoder: `python -m model_export.recover models/default R`, then R/embed.pt),
#                 in the kit as init.pt in fp16; the device's ARGS name it KIT/init.pt
#     CORPUS_DIR  a `disan distill corpus` folder: its texts, kinds and pairs travel, not its
#                 teacher cache (the GPU encodes them faster than the cache could travel)
#     PIECES.npy  the token table's start (`disan distill student` writes RUN/pieces.npy on its
#                 first run: the teacher's vector of each piece alone, PCA-reduced), sent in fp16
#                 so the GPU spends no time on it; `-` for none (the device computes it)
#     DATA_DIR    staged data (default ../shared/data): the dev sets the run is checked on and
#                 what the label terms (--scored-weight ... --nli-classes-weight) read (about 6 MB);
#                 the device's ARGS name it --data KIT/data
#
# Writes .gpurun/q00, q01, ... and .gpurun/run.sh (= research/gpu-lease/device.sh), as pack.sh.
set -euo pipefail
. "$(dirname "$0")/kit-lib.sh"
usage="usage: research/gpu-lease/pack-student.sh [--init START.pt] CORPUS_DIR [PIECES.npy] [DATA_DIR]"
init=-
if [ "${1:-}" = --init ]; then init=${2:?$usage}; shift 2; fi
corpus=${1:?$usage}
pieces=${2:--}; data=${3:-../shared/data}
[ "$init" = - ] || [ -f "$init" ] || { echo "$init: missing"; exit 2; }
for f in corpus.json sentences.txt kinds.npy pairs.npy; do
  [ -f "$corpus/$f" ] || { echo "$corpus/$f: missing (a corpus from \`disan distill corpus\`?)"; exit 2; }
done
[ "$pieces" = - ] || [ -f "$pieces" ] || { echo "$pieces: missing"; exit 2; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
kit=$work/kit; mkdir -p "$kit/corpus" "$kit/cache" "$kit/data"
add_staged_files "$data" "$kit/data"  # first: it stops on a missing file before the slow steps
add_teacher "$kit/cache"
cp "$corpus/corpus.json" "$corpus/sentences.txt" "$corpus/kinds.npy" "$corpus/pairs.npy" "$kit/corpus/"
# pieces.npy whatever the file was called: the device's steps look for that name
[ "$pieces" = - ] || add_cache_file "$pieces" "$kit/cache" pieces.npy
[ "$init" = - ] || python3 -m research slim "$init" "$kit/init.pt"
split_kit "$work"
