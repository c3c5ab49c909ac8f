# Seed 000's recipe for the Skip-Layer Attention baseline (seed 001) at the paper's 50m shape (Table 2):
# seed 000's (n_l, n_h) = (4, 1): the last 1 of 3 query heads of layers 5..6 read layer l - 4.
# FineWeb-Edu, sequence 4096, global batch 256 sequences, AdamW lr 1e-4 constant, weight decay 0.01, 20k steps.
# Global batch = batch_size x gradient_accumulation_steps (divided among the GPUs, as in nanoGPT).
# Prepare the data first: python prepare.py --dataset fineweb-edu --tokenizer gpt2
model = "skiplayer"
out_dir = "out/skiplayer_50m"
dataset = "fineweb-edu"
n_embd = 192
ffn_hidden = 768
n_head = 3
n_layer = 6
n_kv_head = 1
block_size = 4096
batch_size = 8
gradient_accumulation_steps = 32
max_iters = 20000
learning_rate = 1e-4
weight_decay = 0.01
decay_lr = False
eval_interval = 500
eval_iters = 20
skip_layers = 4
skip_heads = 1
