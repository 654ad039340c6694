# The 4 x 128 character-level GPT of shakespeare_char_fast.py with a context of 1,024 characters
# read through a sliding window of 128 (each layer attends to its last 128 positions; four layers
# reach 508 back): training costs as n, not n^2, and with rotary positions the model generates
# past block_size at a constant cost per token (a rolling KV cache). BENCHMARKS.md: against full
# attention and BigBird, and its endless sample.
include("shakespeare_char_fast.py")
out_dir = "out-shakespeare-char-window"
block_size = 1024
window = 128
batch_size = 4  # 4,096 tokens a step
eval_iters = 10
max_iters = 100
lr_decay_iters = 100
eval_interval = 100  # evaluate at the start and the end
