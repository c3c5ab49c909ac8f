# Seed 000's recipe at the paper's 50m shape (Table 2) for Block Attention Residuals (seed 002, Kimi Team's
# definition): the 6 layers form 4 blocks of 2, 2, 1, 1 layers; every sublayer reads a softmax over the embedding, the
# completed block sums and its block's partial sum. Full mode: add --attn_res=full.
# FineWeb-Edu, sequence 4096, global batch 256 sequences, AdamW lr 1e-4 constant, weight decay 0.01, 20k steps.
# Global batch = batch_size x gradient_accumulation_steps (divided among the GPUs, as in nanoGPT).
# Prepare the data first: python prepare.py --dataset fineweb-edu --tokenizer gpt2
model = "attnres"
out_dir = "out/attnres_50m"
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
attn_res = "block"
n_blocks = 4
