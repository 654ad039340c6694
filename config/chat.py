# Talk to the Shakespeare character model: fine-tune it on conversations, the loss on the
# assistant's tokens only. The word tasks (reverse a word, spell it in capitals) check the replies:
#   python train.py config/shakespeare_char_cpu.py          # the base model, about 2 minutes
#   python data/chat/prepare.py --tokenizer_from out-shakespeare-char-cpu
#   python train.py config/chat.py                          # about 3 to 4 minutes on 2 cores
#   python sample.py --out_dir out-chat --chat
# Your own conversations: data/chat/prepare.py --source FILE.jsonl (docs/chat.md has the format).
out_dir = "out-chat"
wandb_project = "chat"

task = "lm"
dataset = "chat"
# its shape and GELU; the token table grows by the chat tokens
init_from = "out-shakespeare-char-cpu"
block_size = 64

device = "cpu"
compile = False
dtype = "float32"
batch_size = 32
max_iters = 1500
eval_interval = 250
eval_iters = 20
log_interval = 10
learning_rate = 1e-3
lr_decay_iters = 1500
min_lr = 1e-4
warmup_iters = 100
dropout = 0.0
