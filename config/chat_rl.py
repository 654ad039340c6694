# Learn from a checker: reinforcement learning on the word tasks after the chat fine-tune, each
# reply scored by data/chat/reward.py's word_letters (the letters in place of the answers
# data/chat/prepare.py writes):
#   python train.py config/chat.py --max_iters=300     # the fine-tune (config/chat.py has the base)
#   python data/chat/reward.py                         # the prompts: data/chat/prompts.jsonl
#   python rl.py config/chat_rl.py
#   python sample.py --out_dir out-chat-rl --chat
# then the rate by stages, each resumed exactly (BENCHMARKS.md: 52.7% -> 98.4% exact match):
#   python rl.py --out_dir=out-chat-rl --init_from=resume --max_iters=800 --learning_rate=1e-4
#   python rl.py --out_dir=out-chat-rl --init_from=resume --max_iters=1200 --learning_rate=3e-4
#   python rl.py --out_dir=out-chat-rl --init_from=resume --max_iters=1600 --learning_rate=1e-4
#   python rl.py --out_dir=out-chat-rl --init_from=resume --max_iters=2000 --learning_rate=5e-5
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
max_iters = 400
eval_interval = 50
log_interval = 10
learning_rate = 5e-5  # the start is fragile: 2e-4 and up undo the fine-tune (BENCHMARKS.md)
decay_lr = False
