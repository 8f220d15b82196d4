#!/usr/bin/env bash
# The GPU check, prepared for a session on a machine with a CUDA GPU; about three minutes on one H200.
#
#     bash bench/gpu.sh [OUT_DIR]          (default OUT_DIR: bench/results; PYTHON=... picks the interpreter)
#
# 1. Throughput of resnet50 at 224 px with and without MemVir at the reference CARS196 geometry (B=128, C=98,
#    N=45, M=10) on synthetic images, peak GPU memory, the loss in blocks vs over the whole matrix, the store in
#    float32 vs float16, and a torch.compile row; every row's timed steps under torch.cuda.set_sync_debug_mode("error"),
#    so a host sync on the step's path is named: OUT_DIR/gpu_throughput.md (and stdout).
# 2. The Trainer end to end on the GPU (bfloat16 autocast, channels_last, pinned memory, loader workers,
#    torch.compile) on glyphs-mini through the CLI: OUT_DIR/trainer_smoke.log.
# 3. A live change whose memory the GPU cannot hold (a real CUDA out-of-memory): refused, the run trains on, and the
#    app's memory budget on the GPU: OUT_DIR/live_change_oom.log.
# 4. With two GPUs or more, the same under torchrun on two of them (NCCL, SyncBatchNorm): OUT_DIR/ddp_smoke.log.
# Every part has its own time limit; a failing part is reported and the next one still runs. Record the figures in
# docs/benchmarks.md only from a run on a GPU.
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${1:-bench/results}"
PYTHON="${PYTHON:-python3}"
export HF_HUB_OFFLINE=1 TQDM_DISABLE=1 GRADIO_ANALYTICS_ENABLED=False
mkdir -p "$OUT_DIR"
failures=0

part() {  # part NAME SECONDS COMMAND...: run with a time limit, tee the output to OUT_DIR/NAME.log
    local name="$1" limit="$2"
    shift 2
    echo "== $name (at most ${limit}s): $*"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    local status=${PIPESTATUS[0]}
    echo "== $name: exit $status after $((SECONDS - start))s"
    [ "$status" -eq 0 ] || failures=$((failures + 1))
}

{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    else
        echo "nvidia-smi: not found"
    fi
    "$PYTHON" -c "import sys, torch, torchvision; print('python', sys.version.split()[0], 'torch', torch.__version__,
'torchvision', torchvision.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
} | tee "$OUT_DIR/environment.txt"

part gpu_throughput 240 "$PYTHON" bench/gpu_throughput.py --device cuda --compile --out "$OUT_DIR/gpu_throughput.md"

part trainer_smoke 120 "$PYTHON" -m memvir train --dataset glyphs-mini --backbone resnet18 --batch-size 64 \
    --max-steps 30 --memvir-n 2 --memvir-m 1 --warmup-epochs 0.5 --num-workers 2 --compile --device cuda \
    --out "$OUT_DIR/trainer_smoke_run"

part live_change_oom 120 "$PYTHON" bench/gpu_live_change.py --device cuda

gpus=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$gpus" -ge 2 ]; then
    part ddp_smoke 120 "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 2 -m memvir train \
        --dataset glyphs-mini --backbone convnet --batch-size 64 --max-steps 30 --memvir-n 2 --memvir-m 1 \
        --warmup-epochs 0.5 --device cuda --out "$OUT_DIR/ddp_smoke_run"
else
    echo "== ddp_smoke: skipped, $gpus GPU(s) here (NCCL needs one GPU per process)" | tee "$OUT_DIR/ddp_smoke.log"
fi

echo "== done: $failures part(s) failed; results in $OUT_DIR"
[ "$failures" -eq 0 ]
