# AILA (seed 003), Architecture 2 with the paper's merge, on seed 000's recipe at its 50m shape (Table 2), so that
# it compares with vanilla_50m.py: FineWeb-Edu, sequence 4096, global batch 256 sequences, AdamW lr 1e-4 constant,
# weight decay 0.01, 20k steps. Seed 003 itself trained 4-layer LSTM/conv models with Adam lr 1e-3.
# Other settings: --aila_arch=1 (with --aila_rank=8 to cut its L(L+1)/2 d x d projections), --aila_merge=residual.
# Global batch = batch_size x gradient_accumulation_steps (divided among the GPUs, as in nanoGPT).
# Prepare the data first: python prepare.py --dataset fineweb-edu --tokenizer gpt2
model = "aila"
out_dir = "out/aila_50m"
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
aila_arch = 2
aila_heads = 1
aila_dk = 64
aila_merge = "relu_layernorm"
