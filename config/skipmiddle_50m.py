# Seed 004's recipe (Learning to Skip the Middle Layers, Table 2 and section 3.1) at seed 000's 50m shape:
# gated middle-out skipping with the adaptive controller, mean-gate targets linear from 1 (first block) to
# gate_target at the middle block (the paper sweeps it from 1 down to 0). The dense sandwich baseline of equal
# depth: add --gated=False. AdamW lr 1e-3, betas (0.8, 0.95), eps 1e-10, no weight decay; linear warm-up over
# the first 10% of the steps from 0.1x the lr, then cosine decay to 0. Sequence 1024, global batch 512 sequences
# (524,288 tokens), about 10B tokens (19,073 steps). warmup_iters is 10% of THIS max_iters: set both when you
# change the length. Global batch = batch_size x gradient_accumulation_steps (divided among the GPUs).
# The paper used FineWeb with the GPT-2 tokenizer; prepare the data first:
#   python prepare.py --dataset fineweb-edu --tokenizer gpt2 --max_tokens 10000000000
model = "skipmiddle"
out_dir = "out/skipmiddle_50m"
dataset = "fineweb-edu"
n_embd = 192
ffn_hidden = 768
n_head = 3
n_layer = 6
n_kv_head = 1
block_size = 1024
batch_size = 32
gradient_accumulation_steps = 16
max_iters = 19073
learning_rate = 1e-3
beta1 = 0.8
beta2 = 0.95
adam_eps = 1e-10
weight_decay = 0.0
decay_lr = True
warmup_iters = 1907
warmup_start = 0.1
lr_decay_iters = 0  # 0 = max_iters
min_lr = 0.0
eval_interval = 500
eval_iters = 20
gated = True
gate_init_std = 0.02
gate_target = 0.5
gate_gamma = 1e-3
gate_delta = 1e-2
