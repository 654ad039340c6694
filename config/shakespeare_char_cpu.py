# The character-level Shakespeare GPT at the size nanoGPT's README runs on a laptop CPU: 4 x 128,
# block 64. nanoGPT reports val loss 1.88 at 2,000 iterations; see BENCHMARKS.md for ours and the
# wall time here.
include("shakespeare_char.py")  # the GPU recipe, then the changes below
out_dir = "out-shakespeare-char-cpu"
device = "cpu"
compile = False
eval_iters = 20
log_interval = 1
block_size = 64
batch_size = 12
n_layer = 4
n_head = 4
n_embd = 128
max_iters = 2000
lr_decay_iters = 2000
dropout = 0.0
# nanoGPT's exact GELU: a step 5 to 8% faster than with GPT-2's tanh form on CPUs with AVX2 alone
# (BENCHMARKS.md)
gelu = "none"
dtype = "float32"  # bf16 autocast is no faster at this size on a CPU (BENCHMARKS.md)
