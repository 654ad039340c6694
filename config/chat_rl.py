# Learn from a checker: reinforcement learning on the word tasks after the chat fine-tune, each
# reply scored by data/chat/reward.py's word_letters (the letters in place of the answers
# data/chat/prepare.py writes):
#   python train.py config/chat.py --max_iters=300     # the fine-tune (config/chat.py has the base)
#   python data/chat/reward.py                         # the prompts: data/chat/prompts.jsonl
#   python rl.py config/chat_rl.py
#   python sample.py --out_dir out-chat-rl --chat
out_dir = "out-chat-rl"
wandb_project = "chat"
init_from = "out-chat"
prompts = "data/chat/prompts.jsonl"
reward = "data/chat/reward.py:word_letters"  # word_task: no right draw of Capitals, no signal

device = "cpu"
dtype = "float32"
batch_size = 8
gradient_accumulation_steps = 2
group_size = 16
max_new_tokens = 8  # a word of 7 letters and its end
temperature = 1.0  # the model's own distribution, whose greedy replies the evaluation scores
std_advantage = True
max_iters = 2000
eval_interval = 50
log_interval = 10
# a warmup to the peak, then a cosine down: the start is fragile (2e-4 from step 0 undoes
# the fine-tune), Capitals is learnt near the peak, the decay keeps the reversals (BENCHMARKS.md)
learning_rate = 3e-4
decay_lr = True
warmup_iters = 1000
lr_decay_iters = 2000
min_lr = 5e-5
