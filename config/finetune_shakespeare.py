# Finetune OpenAI's GPT-2 on Tiny Shakespeare (BPE). gpt2 (124M) runs on a CPU in minutes; on a GPU
# try gpt2-xl.
# Prepare: python data/shakespeare/prepare.py   Sample: python sample.py --out_dir=out-shakespeare
out_dir = "out-shakespeare"
eval_interval = 5
eval_iters = 40
always_save_checkpoint = False
wandb_project = "shakespeare"

task = "lm"
dataset = "shakespeare"
# or gpt2-medium, gpt2-large, gpt2-xl, or a local folder with model.safetensors + config.json
init_from = "gpt2"
block_size = 1024

# 1 row x 32 micro-steps x 1024 tokens = 32,768 tokens per step; Shakespeare is 301,966 tokens:
# 20 steps ~ 2 epochs
batch_size = 1
gradient_accumulation_steps = 32
max_iters = 20

learning_rate = 3e-5  # finetune gently, at a constant rate
decay_lr = False
