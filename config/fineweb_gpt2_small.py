# The skip-middle paper's recipe (Table 2 and section 3.1), for every model (--model picks one;
# the paper's are skipmiddle and, as its dense baselines, skipmiddle --gated=False with 2 to 12 layers):
#   torchrun --standalone --nproc_per_node=gpu train.py config/fineweb_gpt2_small.py --model skipmiddle \
#       --out_dir out/skipmiddle/gated_0.5
# FineWeb (sample-10BT) with the GPT-2 tokenizer; Llama-3-style blocks at GPT-2 small's dimensions: d 768,
# 12 layers, 12 heads, 12 kv heads, SwiGLU hidden 3072 (4d, as the reference code builds it); sequence 1024,
# global batch 512 sequences (524,288 tokens), about 10B tokens (19,073 steps). AdamW lr 1e-3, betas
# (0.8, 0.95), eps 1e-10, no weight decay, no gradient clipping (as the reference code); linear warm-up over the
# first 10% of the steps from 0.1x the lr, then cosine decay to 0. warmup_iters is 10% of THIS max_iters: set
# both when you change the length. The gate settings (gamma 1e-3, delta 1e-2, mean-gate target 0.5 at the middle
# block) are model_skipmiddle.py's defaults; --gate_target sweeps the final target, --gate_gamma 0 turns the
# controller off. Global batch = batch_size x gradient_accumulation_steps, shared among the processes.
# Prepare the data first: python prepare.py --dataset fineweb --tokenizer gpt2 --max_tokens 0
dataset = "fineweb"
tokenizer = "gpt2"  # the data set must be prepared with it (train.py refuses another)
n_embd = 768
ffn_hidden = 3072
n_head = 12
n_layer = 12
n_kv_head = 12
block_size = 1024
batch_size = 32
gradient_accumulation_steps = 16
max_iters = 19073
learning_rate = 1e-3
beta1 = 0.8
beta2 = 0.95
adam_eps = 1e-10
weight_decay = 0.0
grad_clip = 0.0  # off
decay_lr = True
warmup_iters = 1907
warmup_start = 0.1
lr_decay_iters = 0  # 0 = max_iters
min_lr = 0.0
eval_interval = 500
eval_iters = 20
