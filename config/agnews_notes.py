# The course notes' AG News model: 4 layers, 4 heads, d = 32 (d_k = 8), up to 128 tokens, 4,096
# attention weights per layer (3 x 4 x 32 x 8 + 32^2). Small enough to read its attention maps:
#   python classify.py --out_dir=out-agnews-notes --attention_maps maps.png "some headline"
include("agnews.py")  # the AG News recipe, then the changes below
out_dir = "out-agnews-notes"
n_layer = 4
n_head = 4
n_embd = 32
block_size = 128
dropout = 0.1
token_dropout = 0.0
learning_rate = 3e-3  # a narrow model takes a higher rate
