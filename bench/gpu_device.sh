#!/usr/bin/env bash
# The steps of bench/gpu.py's run on the device machine (bench/RESULTS.md, GPU: the recipe).
# Run there from the repo root, one step per call, copied to .gpurun/run.sh and carried with
# the archive pieces (.gpurun/q0 .. q4, which hold /tmp/gpu.tar.xz as built by the recipe):
#   stash    keep this call's piece in /tmp/w (a warm machine keeps /tmp between calls)
#   check    unpack the archive to /tmp/g once; prove CUDA loads and the service imports
#   offline  bench.gpu --parts offline, then --parts sweep
#   service  bench.gpu --parts service at 256 connections, then the 1-client rows, then the
#            sweep's best budget (1,024 / 65,536) at 8 workers
#   verify   (a second lease, after 1,024 / 65,536 became the CUDA default) --parts lengths, then
#            the service's default at 8 and 12 workers and the 1-client rows
# Results go under $OUT (the device tool brings them back).
set -u
step=$1
mkdir -p /tmp/w
for d in .gpurun/q*; do [ -d "$d" ] && cp -n "$d"/* /tmp/w/ 2>/dev/null; done
ls /tmp/w
G=/tmp/g
if [ "$step" = stash ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -V; ldd --version | head -1; nproc
  exit 0
fi
if [ ! -d $G/site ]; then
  cat /tmp/w/gpu.tar.xz.part-* | sha256sum
  mkdir -p $G && cat /tmp/w/gpu.tar.xz.part-* | xz -d -T0 | tar -x -C $G || exit 3
fi
export PYTHONPATH=$G/site:$PWD PATH=$G/wrk/usr/bin:$PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export LD_LIBRARY_PATH=$G/wrk/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B="--bundle $G/bundle --data $G/data"
QUIET="Memcpy nodes|transformer_memcpy|CleanUnusedInitializers"
python3 - <<'PY'
import sys

import onnxruntime as ort

print("ort", ort.__version__, ort.__file__, ort.get_available_providers())
ort.preload_dlls()
s = ort.InferenceSession("/tmp/g/bundle/encoder.fp16.onnx",
                         providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
print("preload_dlls alone ->", s.get_providers())
import fastapi, fastapi_offline, orjson, prometheus_client, pydantic, pydantic_settings, uvicorn  # noqa
print("service imports ok", fastapi.__version__, pydantic.__version__)
sys.exit(0 if s.get_providers()[0] == "CUDAExecutionProvider" else 1)
PY
if [ $? != 0 ]; then  # preload_dlls found no CUDA: point the loader at the nvidia wheels' folders
  SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
  NV=$(find "$SP/nvidia" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)
  echo "adding the nvidia wheels' folders to LD_LIBRARY_PATH"; export LD_LIBRARY_PATH=$NV:$LD_LIBRARY_PATH
fi
wrk --version 2>&1 | head -1
if [ "$step" = offline ]; then
  python3 -m bench.gpu $B --parts offline --json $OUT/gpu_offline.json 2>&1 | grep -Ev "$QUIET" | tee $OUT/offline.log
  python3 -m bench.gpu $B --parts sweep --json $OUT/gpu_sweep.json 2>&1 | grep -Ev "$QUIET" | tee $OUT/sweep.log
fi
if [ "$step" = service ]; then
  S="$B --parts service --seconds 5"
  python3 -m bench.gpu $S --workers 1 4 8 12 --shared-workers 4 8 12 --cpu-sized-workers 8 \
    --json $OUT/gpu_service.json 2>&1 | grep -Ev "$QUIET" | tee $OUT/service.log
  python3 -m bench.gpu $S --connections 1 --workers 1 --shared-workers --cpu-sized-workers \
    --texts-per-request 1 32 --json $OUT/gpu_service1.json 2>&1 | grep -Ev "$QUIET" | tee $OUT/service1.log
  DISAN_MAX_BATCH_SIZE=1024 DISAN_MAX_BATCH_CELLS=65536 python3 -m bench.gpu $S --workers 8 \
    --shared-workers 8 --cpu-sized-workers --json $OUT/gpu_service_sweepbest.json 2>&1 \
    | grep -Ev "$QUIET" | tee $OUT/service_sweepbest.log
fi
if [ "$step" = verify ]; then
  python3 -m bench.gpu $B --parts lengths --json $OUT/gpu_lengths.json 2>&1 | grep -Ev "$QUIET" | tee $OUT/lengths.log
  S="$B --parts service --seconds 5"
  python3 -m bench.gpu $S --workers 8 12 --shared-workers --cpu-sized-workers \
    --json $OUT/gpu_service_default.json 2>&1 | grep -Ev "$QUIET" | tee $OUT/service_default.log
  python3 -m bench.gpu $S --connections 1 --workers 1 --shared-workers --cpu-sized-workers \
    --texts-per-request 1 32 --json $OUT/gpu_service1_default.json 2>&1 | grep -Ev "$QUIET" | tee $OUT/service1_default.log
fi
