#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU and a CUDA build of torch:
#   1. the tests marked cuda (the store and the training step on CUDA against CPU, an NCCL
#      group, two NCCL ranks when there are two GPUs, `hetgmp train --device cuda`);
#   2. one rank's training speed on the GPU against one rank on the CPU (one thread, then all
#      cores), same records, model and global batch, at the train bench's batch and a larger one.
#
#   PYTHON=.venv/bin/python bash bench/gpu_check.sh     # after `make setup TORCH=<CUDA build>`
#
# RECORDS (default 200000) sets the records each speed run trains.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RECORDS=${RECORDS:-200000}
CORES=$(nproc)

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                                 f"{torch.cuda.device_count()} GPU(s), {torch.get_num_threads()} CPU threads")'

echo "== tests marked cuda"
"$PY" -m pytest -q -p no:cacheprovider -m cuda tests

echo "== one rank, deepfm dim 64, hidden 256,128, $RECORDS records: samples/s"
speed() {  # device threads batch -> samples/s from the run's JSON summary
    "$PY" -m trainer.train_cli --device "$1" --threads "$2" --global-batch "$3" --workers 1 \
        --records "$RECORDS" --heldout 0 --model deepfm --embed-dim 64 --hidden 256,128 \
        --placement hash --log-every 0 --log-level WARNING |
        tail -n 1 | "$PY" -c 'import json, sys; print(round(json.load(sys.stdin)["samples_per_s"]))'
}
for batch in 2048 8192; do
    gpu=$(speed cuda 1 "$batch")
    one=$(speed cpu 1 "$batch")
    all=$(speed cpu "$CORES" "$batch")
    echo "global batch $batch: cuda $gpu, cpu 1 thread $one, cpu $CORES threads $all;" \
         "cuda over 1 thread $(awk "BEGIN {printf \"%.2f\", $gpu / $one}")," \
         "over $CORES threads $(awk "BEGIN {printf \"%.2f\", $gpu / $all}")"
done
