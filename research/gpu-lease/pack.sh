#!/usr/bin/env bash
# Pack what a distillation lease on a lent GPU needs into carry-sized pieces (docs/distillation.md,
# "5. On a lent GPU"). Run here, from the repo root:
#
#   research/gpu-lease/pack.sh STUDENT.pt [CORPUS_DIR] [DATA_DIR]
#     STUDENT.pt  the checkpoint the GPU phase starts from (--init-from), sent in fp16; `-` for
#                 none (a kit for `run.sh scratch` alone)
#     CORPUS_DIR  a `disan corpus` folder (default runs/corpus): its sentences travel, not its
#                 teacher cache (the GPU re-encodes them faster than the cache can travel)
#     DATA_DIR    staged data (default ../shared/data): the STS sets the phase trains on / checks
#
# CACHE_FILES="A.npy B.npy" adds files to the kit's cache folder: the static word vectors a
# student from scratch starts from (`disan pretrain --corpus ... --word-vectors-only` computes them
# and prints the file; `disan.train.word_vectors.static_vectors` names and finds them there), so the device
# neither encodes the words nor needs scikit-learn for their PCA.
#
# Writes .gpurun/q00, q01, ... (one piece each, sized to what a call may carry beside the
# checkout once models/default is moved out) and .gpurun/run.sh (= research/gpu-lease/device.sh).
set -euo pipefail
. "$(dirname "$0")/kit-lib.sh"
student=${1:?usage: research/gpu-lease/pack.sh STUDENT.pt [CORPUS_DIR] [DATA_DIR]}
corpus=${2:-runs/corpus}; data=${3:-../shared/data}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
kit=$work/kit; mkdir -p "$kit/corpus" "$kit/cache" "$kit/data/stsb" "$kit/data/senteval/SICK"
add_teacher "$kit/cache"
[ "$student" = - ] || python3 -m research slim "$student" "$kit/student.pt"
for f in ${CACHE_FILES:-}; do add_cache_file "$f" "$kit/cache"; done
cp "$corpus/corpus.json" "$corpus/sentences.txt" "$kit/corpus/"
cp "$data"/stsb/*.jsonl.gz "$kit/data/stsb/"
cp "$data"/senteval/SICK/sick_{train,dev}.jsonl.gz "$kit/data/senteval/SICK/"
split_kit "$work"
