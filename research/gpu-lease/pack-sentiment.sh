#!/usr/bin/env bash
# Pack what an SST-5 lease on a lent GPU needs (docs/experiments.md, "SST-5 on a lent GPU"): the
# SST files, the vocabulary, the static word vectors the runs start from and a teacher's logits.
# Run here, from the repo root:
#
#   research/gpu-lease/pack-sentiment.sh VOCAB.json [SOFT.npz|-|mpnet] [DATA_DIR]
#     VOCAB.json  the runs' vocabulary (`disan train --vocab`; the bundle's task models share one)
#     SOFT.npz    `disan task-teacher`'s logits of the training phrases (`--soft-targets`), or -;
#                 mpnet: none yet, the kit carries MPNet in fp16 (`disan slim`) and device.sh's
#                 `task-teacher` step fine-tunes it there and writes them (an hour here, minutes there)
#     DATA_DIR    staged data (default ../shared/data): its sst/sst5_*.jsonl.gz travel
#
# AUGMENTED=FILE.npz also packs teacher-labelled extra examples (`disan task-teacher --augment` or
# `--unlabelled`) as the kit's augmented.npz, which a run reads with `--augmented KIT/augmented.npz`.
# INIT (default minilm) and DIM (default 300) name the static word vectors (`--init`,
# `--embed-dim`); they are computed here if not cached yet, so the device needs neither the word
# encoder nor scikit-learn. Writes .gpurun/ as pack.sh does; device.sh's `sentiment` step runs it.
set -euo pipefail
. "$(dirname "$0")/kit-lib.sh"
vocab=${1:?usage: research/gpu-lease/pack-sentiment.sh VOCAB.json [SOFT.npz|-|mpnet] [DATA_DIR]}
soft=${2:--}; data=${3:-../shared/data}
for f in "$vocab" "$soft" "$data/sst/sst5_dev.jsonl.gz" ${AUGMENTED:+"$AUGMENTED"}; do  # one line, before any work
  [ "$f" = - ] || [ "$f" = mpnet ] || [ -f "$f" ] || { echo "$f: not found" >&2; exit 2; }
done
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
kit=$work/kit; mkdir -p "$kit/cache" "$kit/data/sst"
vectors=$(python3 -c '
import sys
from disan.train import word_vectors as E
from disan.text.tokenizer import Vocab
vocab, dim, source = Vocab.load(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
E.static_vectors(vocab, dim, source)
print(E.static_vectors_file(vocab, dim, source))' "$vocab" "${DIM:-300}" "${INIT:-minilm}")
add_cache_file "$vectors" "$kit/cache"
cp "$vocab" "$kit/vocab.json"
case $soft in
  -) ;;
  mpnet) add_teacher "$kit/cache" ;;
  *) cp "$soft" "$kit/soft.npz" ;;
esac
[ -z "${AUGMENTED:-}" ] || cp "$AUGMENTED" "$kit/augmented.npz"
cp "$data"/sst/sst5_{phrases_train,dev,test}.jsonl.gz "$kit/data/sst/"
split_kit "$work"
