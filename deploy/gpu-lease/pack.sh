#!/usr/bin/env bash
# Pack what a distillation lease on a lent GPU needs into carry-sized pieces (docs/distillation.md,
# "5. On a lent GPU"). Run here, from the repo root:
#
#   deploy/gpu-lease/pack.sh STUDENT.pt [CORPUS_DIR] [DATA_DIR]
#     STUDENT.pt  the checkpoint the GPU phase starts from (--init-from), sent in fp16; `-` for
#                 none (a kit for `run.sh scratch` alone)
#     CORPUS_DIR  a `disan corpus` folder (default runs/corpus): its sentences travel, not its
#                 teacher cache (the GPU re-encodes them faster than the cache can travel)
#     DATA_DIR    staged data (default ../shared/data): the STS sets the phase trains on / checks
#
# CACHE_FILES="A.npy B.npy" adds files to the kit's cache folder: the static word vectors a
# student from scratch starts from (`disan pretrain --corpus ... --word-vectors-only` computes them
# and prints the file; `disan.embeddings.static_vectors` names and finds them there), so the device
# neither encodes the words nor needs scikit-learn for their PCA.
#
# Writes .gpurun/q00, q01, ... (one piece each, sized to what a call may carry beside the
# checkout once models/default is moved out) and .gpurun/run.sh (= deploy/gpu-lease/device.sh).
set -euo pipefail
student=${1:?usage: deploy/gpu-lease/pack.sh STUDENT.pt [CORPUS_DIR] [DATA_DIR]}
corpus=${2:-runs/corpus}; data=${3:-../shared/data}
teacher=$(python3 -c 'from disan.embeddings import mpnet_model_dir; print(mpnet_model_dir())')
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
kit=$work/kit; mkdir -p "$kit/corpus" "$kit/cache" "$kit/data/stsb" "$kit/data/senteval/SICK"
disan slim "$teacher" "$kit/cache/all-mpnet-base-v2"
[ "$student" = - ] || disan slim "$student" "$kit/student.pt"
# word vectors (.npy) travel in fp16, half the bytes: init_matrix reads them back as float32
for f in ${CACHE_FILES:-}; do
  case $f in
    *.npy) python3 -c 'import sys, numpy as np; np.save(sys.argv[2], np.load(sys.argv[1]).astype(np.float16))' \
             "$f" "$kit/cache/$(basename "$f")" ;;
    *) cp "$f" "$kit/cache/" ;;
  esac
done
cp "$corpus/corpus.json" "$corpus/sentences.txt" "$kit/corpus/"
cp "$data"/stsb/*.jsonl.gz "$kit/data/stsb/"
cp "$data"/senteval/SICK/sick_{train,dev}.jsonl.gz "$kit/data/senteval/SICK/"
tar -cf - -C "$work" kit | xz -T0 -3 > "$work/kit.tar.xz"
# the limit is 64 MiB a call: what travels anyway (the checkout without models/default) and a margin
tree=$(git ls-files -z | grep -zv '^models/default/' | xargs -0 du -cb | tail -1 | cut -f1)
piece=$(( 64 * 1024 * 1024 - tree - 1024 * 1024 ))
grep -qx '/.gpurun/' .git/info/exclude || echo '/.gpurun/' >> .git/info/exclude
rm -rf .gpurun && mkdir -p .gpurun
split -b "$piece" -d -a 2 "$work/kit.tar.xz" .gpurun/kit.tar.xz.part-
for p in .gpurun/kit.tar.xz.part-*; do d=.gpurun/q${p##*-}; mkdir "$d"; mv "$p" "$d/"; done
(cd "$work" && sha256sum kit.tar.xz | cut -d' ' -f1) > .gpurun/kit.sha256
cp deploy/gpu-lease/device.sh .gpurun/run.sh
n=$(ls -d .gpurun/q* | wc -l)
echo "kit: $(stat -c %s "$work/kit.tar.xz") bytes in $n pieces of <= $piece; sha256 $(cat .gpurun/kit.sha256)"
echo "next: mv models/default /tmp/models-default, then one device call per piece (see device.sh)"
