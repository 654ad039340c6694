#!/usr/bin/env bash
# The GPU checks, as one script: about 5 minutes on an H200. On a CUDA machine, from the repository root:
#   bash bench/gpu.sh [RESULTS_DIR]          (default: gpu-results)
# The checks run in the repository root whatever the working directory; RESULTS_DIR is relative to the latter.
# It needs the prepared data sets data/shakespeare_char, data/shakespeare and data/agnews (their prepare.py, with
# --source offline) and, offline, TIKTOKEN_CACHE_DIR for GPT-2's BPE. What it measures goes to RESULTS_DIR/log.txt:
#   1. bench/speed.py on CUDA: matmul peaks, training steps of three configs' shapes (fp32 = TF32, bf16,
#      bf16 + compile), AdamW, generation with and without the KV cache, the attention paths
#   2. GPT-2 124M (config/gpt2.py's shape) trained by train.py: tokens/s and MFU in bf16 with flash attention and compile
#   3. the fast recipe against GPT-2's on config/shakespeare_char.py's shape: val loss against seconds
#   4. torchrun (NCCL, DDP then compile), a resume in float16 of a bf16 run, deterministic mode twice, sample, classify
set -u
R=$(realpath -m "${1:-gpu-results}")
cd "$(dirname "$0")/.." || exit 1  # the repository root
mkdir -p "$R"
W=$(mktemp -d)  # the runs' out_dirs: only the figures go to RESULTS_DIR
export PYTHONUNBUFFERED=1 WANDB_MODE=offline TQDM_MININTERVAL=10
exec > >(tee -a "$R/log.txt") 2>&1
step() { local name=$1 t=$2; shift 2; echo "=== $name ($(date +%T))"; timeout "$t" "$@"; echo "=== $name: exit $?"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())"

step bench 200 python bench/speed.py --device cuda --repeats 3 --json "$R/bench-cuda.json"

step gpt2 150 python train.py config/gpt2.py --dataset=shakespeare --wandb_log=False --gradient_accumulation_steps=1 \
    --max_iters=80 --warmup_iters=10 --eval_interval=80 --eval_iters=2 --log_interval=10 --out_dir="$W/gpt2"
python -c "import json, sys; [print(l.strip()) for l in open(sys.argv[1]) if 'mfu' in l]" "$W/gpt2/metrics.jsonl"

FAST="--optimizer=muon --learning_rate=2e-2 --min_lr=2e-3 --warmup_iters=30 --rope=True --qk_norm=True"  # shakespeare_char_fast.py's
step time-to-loss 200 python bench/speed.py --time_to_loss \
    "config/shakespeare_char.py --max_iters=1500 --lr_decay_iters=1500 --eval_interval=250 --eval_iters=50" \
    "config/shakespeare_char.py --max_iters=1500 --lr_decay_iters=1500 --eval_interval=250 --eval_iters=50 $FAST" \
    --target 1.6 --repeats 1 --png "$R/time_to_loss_gpu.png" --json "$R/time_to_loss_gpu.json"

S="config/shakespeare_char.py --max_iters=100 --eval_interval=50 --eval_iters=10 --log_interval=25"
step torchrun-compile 120 torchrun --standalone --nproc_per_node=1 train.py $S --compile=True --out_dir="$W/ddp"
step resume-float16 60 python train.py --out_dir="$W/ddp" --init_from=resume --max_iters=150 --dtype=float16
for i in 1 2; do
    step "deterministic-$i" 60 python train.py $S --max_iters=50 --deterministic=True --out_dir="$W/det$i"
done
python -c "import json, sys; a, b = ([json.loads(l) for l in open(p) if 'val/loss' in l][-1]['val/loss'] for p in sys.argv[1:]); print('deterministic reruns: val loss', a, b, 'identical' if a == b else 'DIFFERENT')" "$W/det1/metrics.jsonl" "$W/det2/metrics.jsonl"
step sample 60 python sample.py --out_dir="$W/ddp" --max_new_tokens=200 --num_samples=4
step agnews 120 python train.py config/agnews.py --max_iters=200 --eval_interval=100 --token_dropout=0.9 --out_dir="$W/agnews"
step classify 60 python classify.py --out_dir="$W/agnews" "Stocks fall as oil hits a record" "Lakers win again in overtime"
echo "=== done ($(date +%T))"
rm -rf "$W"
