# Open AttnRes's recipe (Open Attention Residuals, "training from scratch") at its 0.6B shape, for every model
# (--model picks one):
#   torchrun --standalone --nproc_per_node=gpu train.py config/fineweb_edu_qwen3_600m.py --model attnres \
#       --n_blocks 8 --out_dir out/attnres_600m/block
# The paper trains the baseline (--model vanilla) and Block AttnRes with 8 blocks as at 100M, at Qwen3-0.6B's
# shape: d 1024, 28 layers, 16 heads, 8 kv heads, ffn 3072 (Qwen3-0.6B's heads are 128 wide; here, as in the
# authors' code, d / heads = 64).
# The rest is the authors' train_scratch.py with the settings of their 0.6B launch script: sequence 2048, 32
# sequences per step (2 per GPU, 2 accumulation steps, 8 GPUs), AdamW lr 3e-4, betas (0.9, 0.95), eps 1e-8,
# weight decay 0.1, gradient clipping 1.0, 1,000 linear warm-up steps from 0, cosine decay to 3e-5, tied
# embeddings, RMSNorm eps 1e-6.
# Differences: the GPT-2 tokenizer instead of Qwen3's; FineWeb-Edu's sample-10BT instead of the whole set;
# weight decay here skips norms and biases (the script decays every parameter).
# Prepare the data first: python prepare.py --dataset fineweb-edu --tokenizer gpt2 --max_tokens 0
base = "fineweb_edu_qwen3_100m.py"  # the same recipe; only what follows differs
n_embd = 1024
ffn_hidden = 3072
n_head = 16
n_layer = 28
n_kv_head = 8
batch_size = 2
learning_rate = 3e-4
min_lr = 3e-5
