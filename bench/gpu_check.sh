#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU and a CUDA build of torch:
#   1. the tests marked cuda (the store and the training step on CUDA against CPU, an NCCL
#      group, two NCCL ranks when there are two GPUs, `hetgmp train --device cuda`);
#   2. `hetgmp bench gpu`: one rank's samples/s on the GPU, the trainer's step against the model
#      alone on gathered rows (and their ratio), milliseconds by phase, device syncs a step and
#      peak device memory, at global batches 8,192 and 65,536; its JSON summary is written to
#      $GPU_JSON (default bench_gpu.json); then the same with the model under torch.compile
#      (--compile on), into <$GPU_JSON less .json>_compile.json;
#   3. one rank's training speed on the GPU against one rank on the CPU (one thread, then all
#      cores; the one embedding store, on the rank's device), same records, model and global
#      batch, at the train bench's batch and a larger one, with the milliseconds a step spends
#      in each phase (host wall time).
#
#   PYTHON=.venv/bin/python bash bench/gpu_check.sh     # after `make setup TORCH=<CUDA build>`
#
# RECORDS (default 200000) sets the records each speed run trains.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RECORDS=${RECORDS:-200000}
CORES=$(nproc)

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                                 f"{torch.cuda.device_count()} GPU(s), {torch.get_num_threads()} CPU threads")'
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' || {
    echo "error: torch sees no CUDA device (a CPU build of torch? make setup TORCH=<CUDA build>)" >&2
    exit 2
}

echo "== tests marked cuda"
# A failing test does not stop the measurements below; the script exits with its status last.
# The cuda tests live under tests/trainer, which collects without the Kafka clients and pymetis
# (the H200 image has neither; tests/streaming imports kafka-python at collection).
tests_status=0
"$PY" -m pytest -q -p no:cacheprovider -m cuda tests/trainer || tests_status=$?

echo "== hetgmp bench gpu (JSON summary: ${GPU_JSON:=bench_gpu.json})"
"$PY" -m bench.gpu --device cuda | tee "$GPU_JSON.log"
tail -n 1 "$GPU_JSON.log" >"$GPU_JSON"
echo "== hetgmp bench gpu --compile on (JSON summary: ${GPU_JSON%.json}_compile.json)"
"$PY" -m bench.gpu --device cuda --compile on | tee "$GPU_JSON.compile.log"
tail -n 1 "$GPU_JSON.compile.log" >"${GPU_JSON%.json}_compile.json"

echo "== one rank, deepfm dim 64, hidden 256,128, $RECORDS records"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {  # name device threads batch: the run's JSON summary (its last line) into $tmp/<name>
    "$PY" -m hetgmp.trainer.app.cli train --device "$2" --threads "$3" --global-batch "$4" --workers 1 \
        --records "$RECORDS" --heldout 0 --model deepfm --embed-dim 64 --hidden 256,128 \
        --placement hash --log-every 0 --log-level WARNING | tail -n 1 >"$tmp/$1"
}
report='
import json, sys
batch, cores, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = [json.load(open(p)) for p in paths]
gpu = runs[0]["samples_per_s"]
for name, r in zip(["cuda", "cpu, 1 thread", "cpu, %s threads" % cores], runs):
    steps, rate = r["steps"], r["samples_per_s"]
    ms = "  ".join("%s %.1f" % (k, 1000 * v / steps) for k, v in r["seconds_by_phase"].items())
    vs = "" if r is runs[0] else "  (cuda %.2fx)" % (gpu / rate)
    print(f"batch {batch:>5}  {name:<15} {rate:>9,.0f} samples/s{vs:<15}  ms a step: {ms}")
'
for batch in 2048 8192; do
    run gpu cuda 1 "$batch"
    run one cpu 1 "$batch"
    run all cpu "$CORES" "$batch"
    "$PY" -c "$report" "$batch" "$CORES" "$tmp/gpu" "$tmp/one" "$tmp/all"
done

if [ "$tests_status" -ne 0 ]; then
    echo "error: the cuda tests failed (pytest exit status $tests_status); the figures above ran anyway" >&2
    exit "$tests_status"
fi
