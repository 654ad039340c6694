# A GPT on your own text, prepared by data/text/prepare.py (a BPE of 4,096 tokens trained on it, by
# default), at a size a laptop's CPU trains in minutes; on a GPU, config/shakespeare_char.py's size
# and batch fit better. BENCHMARKS.md compares the tokenizers on Tiny Shakespeare at this size.
# Prepare: python data/text/prepare.py --source FILE_OR_FOLDER
# Sample:  python sample.py --out_dir=out-text
out_dir = "out-text"
eval_interval = 100
eval_iters = 20
log_interval = 10

task = "lm"
dataset = "text"
batch_size = 16
block_size = 128

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0

learning_rate = 1e-3
max_iters = 1000
lr_decay_iters = 1000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100
