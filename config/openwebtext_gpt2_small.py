# The SLA paper's recipe (Skip-Layer Attention, section 4) at GPT2 (124M), for every model (--model picks one):
#   torchrun --standalone --nproc_per_node=gpu train.py config/openwebtext_gpt2_small.py --model skiplayer \
#       --out_dir out/sla_small_16384/skiplayer
# OpenWebText with the GPT-2 tokenizer, 524,288 tokens per step, 18,000 steps (about one pass over its 9B
# tokens), lr 1.5e-4. The paper ran this size at sequence length 16384 (Tables 1-3), 8192 and 4096 (Table 3);
# the shorter ones keep the tokens per step with --block_size 8192 --batch_size 4 or --block_size 4096 --batch_size 8.
# The blocks are this repository's Llama-style ones at GPT-2's width, depth and heads (no GQA, tied embeddings,
# SwiGLU of hidden size 4d as the Vertical Attention and skip-middle papers use), not GPT-2's. The paper names its
# lr and its code base, nanoGPT; the rest is nanoGPT's defaults: AdamW betas (0.9, 0.95), weight decay 0.1, gradient
# clipping 1.0, 2,000 warm-up steps, cosine decay to lr / 10. skiplayer's default (n_l, n_h) is the paper's
# recommendation, 3/4 of the layers and heads (Table 3); Tables 1-2 set --skip_layers and --skip_heads.
# Prepare the data first (a validation set of about 4M tokens, as the paper's):
#   python prepare.py --dataset openwebtext --tokenizer gpt2 --max_tokens 0 --val_fraction 0.0005
dataset = "openwebtext"
tokenizer = "gpt2"  # the data set must be prepared with it (train.py refuses another)
n_embd = 768
ffn_hidden = 3072
n_head = 12
n_layer = 12
n_kv_head = 12
tie_embeddings = True
block_size = 16384
batch_size = 2
gradient_accumulation_steps = 16  # 2 x 16 x 16384 = 524,288 tokens per step
max_iters = 18000
learning_rate = 1.5e-4
weight_decay = 0.1
decay_lr = True
warmup_iters = 2000
min_lr = 1.5e-5
eval_interval = 500
eval_iters = 20
