# Seed 000's recipe for Vertical Attention (its main method) at the paper's 100m shape (Table 2):
# The L(L+1)/2 vertical attention scores get their own AdamW lr 0.01 and weight decay 0.01 (the paper's sweep:
# 1e-4 leaves the map frozen, 0.1 is unstable). Fixed maps of Table 3: add --va_map=unet or --va_map=inet.
# FineWeb-Edu, sequence 4096, global batch 256 sequences, AdamW lr 1e-4 constant, weight decay 0.01, 20k steps.
# Global batch = batch_size x gradient_accumulation_steps (divided among the GPUs, as in nanoGPT).
# Prepare the data first: python prepare.py --dataset fineweb-edu --tokenizer gpt2
model = "vertical"
out_dir = "out/vertical_100m"
dataset = "fineweb-edu"
n_embd = 384
ffn_hidden = 1536
n_head = 6
n_layer = 8
n_kv_head = 3
block_size = 4096
batch_size = 8
gradient_accumulation_steps = 32
max_iters = 20000
learning_rate = 1e-4
weight_decay = 0.01
decay_lr = False
eval_interval = 500
eval_iters = 20
va_map = "learned"
va_lr = 0.01
va_weight_decay = 0.01
