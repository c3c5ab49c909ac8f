# Seed 000's recipe for its ALA(-) baseline at the paper's 300m shape (Table 2): only the last layer changes;
# with K = 2 its query heads read layers 12, 10, 8, 6, 4, 2, 12, 12, 12, 12, 12, 12
# (head i reads layer L - 2i; its own layer where that is below 1).
# FineWeb-Edu, sequence 4096, global batch 256 sequences, AdamW lr 1e-4 constant, weight decay 0.01, 20k steps.
# Global batch = batch_size x gradient_accumulation_steps (divided among the GPUs, as in nanoGPT).
# Prepare the data first: python prepare.py --dataset fineweb-edu --tokenizer gpt2
model = "skiplayer"
out_dir = "out/ala_300m"
dataset = "fineweb-edu"
n_embd = 768
ffn_hidden = 3072
n_head = 12
n_layer = 12
n_kv_head = 4
block_size = 4096
batch_size = 8
gradient_accumulation_steps = 32
max_iters = 20000
learning_rate = 1e-4
weight_decay = 0.01
decay_lr = False
eval_interval = 500
eval_iters = 20
ala_every = 2
skip_heads = 0  # the SLA skip is off (ala_every > 0 turns it off anyway)
