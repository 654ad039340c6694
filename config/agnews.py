# AG News topic classification (World, Sports, Business, Sci/Tech) with an encoder trained from
# scratch.
# python train.py config/agnews.py  (prepares data/agnews first when it is missing; offline: see
# the README)
# On the 15,023-row sample, 2 CPU cores: see BENCHMARKS.md for the accuracy and the wall time.
out_dir = "out-agnews"
task = "classify"
dataset = "agnews"
eval_interval = 250
eval_iters = 100  # x batch_size rows: the whole validation split of the sample, in order
log_interval = 50

# GPT-2 BPE tokens, up to 128 per text (prepare.py cuts there); batches are padded to their longest
# row
block_size = 128
batch_size = 64
n_layer = 2
n_head = 4
n_embd = 128
dropout = 0.1
# Small data overfits within two epochs: hiding 30% of each row's tokens (a fresh draw every step)
# works as data augmentation, together with strong weight decay (BENCHMARKS.md)
token_dropout = 0.3
# fastText beside the encoder: a linear classifier over the tokens and their hashed bigrams, trained
# by its own loss at 200x the learning rate; the prediction averages the two models'
# log-probabilities. Its hashed bigrams carry the gain over the encoder alone (BENCHMARKS.md: the
# protocol, the hold-out, the ablation)
bow_head = True
bow_buckets = 262144

learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 100
max_iters = 1000  # about 4 epochs of the 15,023-row sample
lr_decay_iters = 1000
weight_decay = 0.5
# dtype is left at auto: bfloat16 autocast where the hardware has it, faster than float32 with the
# same validation curve (BENCHMARKS.md)
