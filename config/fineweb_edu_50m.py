# The Vertical Attention paper's recipe (section 4.1) at its 50m shape, for every model (--model picks one):
#   torchrun --standalone --nproc_per_node=gpu train.py config/fineweb_edu_50m.py --model vertical \
#       --out_dir out/va_50m/vertical
# Shape (Table 2): d 192, ffn 768, 3 heads, 6 layers, 1 kv head. FineWeb-Edu with the GPT-2 tokenizer (the
# paper used Llama 3's), sequence 4096, global batch 256 sequences, 20k steps (about 21B tokens), AdamW with a
# constant lr 1e-4 and weight decay 0.01. The model files hold their papers' own settings: vertical's scores get
# lr 0.01 and weight decay 0.01 (va_lr, va_weight_decay), skiplayer takes that paper's (n_l, n_h) for this size
# from its SIZE_DEFAULTS; ALA(-) is --model skiplayer --ala_every 2.
# Global batch = batch_size x gradient_accumulation_steps, shared among the processes.
# Prepare the data first (sample-10BT holds about 10B tokens, so 20k steps read it about twice; the paper made
# one pass over a 20B-token subset): python prepare.py --dataset fineweb-edu --tokenizer gpt2 --max_tokens 0
size = "50m"  # the shape above, and the model file's SIZE_DEFAULTS
dataset = "fineweb-edu"
tokenizer = "gpt2"  # the data set must be prepared with it (train.py refuses another)
block_size = 4096
batch_size = 8
gradient_accumulation_steps = 32
max_iters = 20000
learning_rate = 1e-4
weight_decay = 0.01
decay_lr = False  # constant, "without any scheduler"
eval_interval = 500
eval_iters = 20
