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
gradient_accumulation_steps = 2
group_size = 16
max_new_tokens = 8  # a word of 7 letters and its end
temperature = 1.0  # the model's own distribution, whose greedy replies the evaluation scores
std_advantage = True
max_iters = 400
eval_interval = 50
log_interval = 10
learning_rate = 5e-5  # 1e-4 climbs no faster (BENCHMARKS.md)
decay_lr = False
