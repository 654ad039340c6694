# GPT-2 124M from scratch on OpenWebText, as nanoGPT: 8 GPUs, about 0.5M tokens per step, val loss
# about 2.85.
# Prepare: python data/openwebtext/prepare.py --num_proc=8
# Run:     torchrun --standalone --nproc_per_node=8 train.py config/gpt2.py
out_dir = "out-gpt2"
wandb_log = True
wandb_project = "owt"

task = "lm"
dataset = "openwebtext"
# 16 rows x 1024 tokens x 32 micro-steps = 524,288 tokens (2^19) per step, whatever the number of
# processes; 32 micro-steps share out evenly over 1, 2, 4, 8, 16 or 32 processes (docs/scaling.md's
# one- and two-node commands)
batch_size = 16
block_size = 1024
gradient_accumulation_steps = 32
# GPT-2's 50,257 rounded up to a multiple of 64: faster matmuls, the extra rows go unused
vocab_size = 50304

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False

learning_rate = 6e-4
max_iters = 600000  # 300B tokens
lr_decay_iters = 600000
min_lr = 6e-5
warmup_iters = 2000
weight_decay = 1e-1

eval_interval = 1000
eval_iters = 200
log_interval = 10
# bfloat16 where the GPU has bfloat16 matmuls (A100, H100), float16 (with a GradScaler) before
dtype = "auto"
compile = True
