# A small character-level GPT on Tiny Shakespeare, GPU size (nanoGPT's recipe): about 3 minutes on
# one A100.
# Prepare: python data/shakespeare_char/prepare.py
# Sample: python sample.py --out_dir=out-shakespeare-char
out_dir = "out-shakespeare-char"
eval_interval = 250  # it overfits quickly: evaluate often, keep the best
eval_iters = 200
log_interval = 10
always_save_checkpoint = False

wandb_project = "shakespeare-char"

task = "lm"
dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256  # 256 characters of context

n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2

learning_rate = 1e-3  # a tiny model can take a high rate
max_iters = 5000
lr_decay_iters = 5000
min_lr = 1e-4
beta2 = 0.99  # more tokens per step than GPT-2: a slightly faster second moment is fine
warmup_iters = 100
