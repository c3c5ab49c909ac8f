# Open AttnRes's recipe (Open Attention Residuals, "training from scratch") at its 100M shape, for every model
# (--model picks one):
#   torchrun --standalone --nproc_per_node=gpu train.py config/fineweb_edu_qwen3_100m.py --model attnres \
#       --out_dir out/attnres_100m/block
# The paper trains the baseline (--model vanilla), Block AttnRes (4 blocks, the model's default) and Full AttnRes
# (--attn_res full) with identical hyperparameters on FineWeb-Edu for 20k steps, at a Qwen3-style shape: d 512,
# 12 layers, 8 heads, 4 kv heads, ffn 1536.
# The rest is the defaults of the authors' train_scratch.py (their 100M runs): sequence 2048, 64 sequences per
# step (4 per GPU, 2 accumulation steps, 8 GPUs), AdamW lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1,
# gradient clipping 1.0, 1,000 linear warm-up steps from 0, cosine decay to 6e-5, tied embeddings, RMSNorm eps
# 1e-6.
# Differences: the GPT-2 tokenizer instead of Qwen3's; FineWeb-Edu's sample-10BT instead of the whole set;
# weight decay here skips norms and biases (the script decays every parameter).
# Prepare the data first: python prepare.py --dataset fineweb-edu --tokenizer gpt2 --max_tokens 0
dataset = "fineweb-edu"
tokenizer = "gpt2"  # the data set must be prepared with it (train.py refuses another)
n_embd = 512
ffn_hidden = 1536
n_head = 8
n_layer = 12
n_kv_head = 4
tie_embeddings = True
norm_eps = 1e-6
block_size = 2048
batch_size = 4
gradient_accumulation_steps = 16  # 4 x 16 = 64 sequences of 2048 = 131,072 tokens per step
max_iters = 20000
learning_rate = 6e-4
weight_decay = 0.1
decay_lr = True
warmup_iters = 1000
min_lr = 6e-5
eval_interval = 500
eval_iters = 20
