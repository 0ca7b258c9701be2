#!/usr/bin/env bash
# The GPU check, one run on the device machine (about 4 minutes on one H200, 16 cores):
# tests/test_cuda.py, then the whole suite with nbval on every chapter (no browser or site
# tests: no Chromium or Sphinx there). Needs the wheels of .ci/gpu/wheels.sh in .whl/.
# Logs and a JUnit report land in $OUT (the device tool brings them back).
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu-check}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH="/tmp/site:$PWD/pkg"
nvidia-smi -L; nproc
python3 -c "import sys, torch, pandas; print(sys.version.split()[0], torch.__version__, \
torch.cuda.device_count(), pandas.__version__)"
t0=$(date +%s)
timeout 150 python3 -m pytest tests/test_cuda.py -o addopts="-p no:cacheprovider" -v \
  --durations=5 2>&1 | tee "$OUT/cuda.log"
echo "cuda tests: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout "${SUITE_S:-330}" python3 -m pytest -n "${WORKERS:-14}" --ignore tests/browser \
  --ignore tests/test_site.py --timeout 120 -q -rfEs --durations=25 \
  --junitxml="$OUT/suite.xml" "$@" 2>&1 | tee "$OUT/suite.log" | grep -v "^\.\|PASSED"
echo "suite: $(( $(date +%s) - t0 )) s"
