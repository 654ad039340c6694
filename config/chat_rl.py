# Learn from a checker: reinforcement learning on the word tasks after the chat fine-tune, each
# reply scored by data/chat/reward.py's word_task (the answers data/chat/prepare.py writes):
#   python train.py config/chat.py --max_iters=300     # the fine-tune (config/chat.py has the base)
#   python data/chat/reward.py                         # the prompts: data/chat/prompts.jsonl
#   python rl.py config/chat_rl.py
#   python sample.py --out_dir out-chat-rl --chat
out_dir = "out-chat-rl"
wandb_project = "chat"
init_from = "out-chat"
prompts = "data/chat/prompts.jsonl"
reward = "data/chat/reward.py:word_task"

device = "cpu"
dtype = "float32"
batch_size = 8
group_size = 8
max_new_tokens = 8  # a word of 7 letters and its end
max_iters = 100
eval_interval = 20
log_interval = 5
learning_rate = 1e-4
min_lr = 1e-5
warmup_iters = 5
lr_decay_iters = 100
