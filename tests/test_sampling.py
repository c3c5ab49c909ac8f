"""Sampling's filters against distributions computed by hand: temperature, top-k and top-p (generate.py's
sampling_probs), the sampler that draws from them (sample_next), and sample.py's options that set them. The logits
are log([0.5, 0.25, 0.15, 0.1]), so that every filtered distribution is a few fractions."""
import math

import pytest
import torch

from generate import sample_next, sampling_probs

P = [0.5, 0.25, 0.15, 0.1]
LOGITS = torch.tensor([P]).log()

# (temperature, top_k, top_p, the distribution worked out by hand)
BY_HAND = [
    (1.0, None, None, P),
    (2.0, None, None, [0.370090, 0.261693, 0.202707, 0.165509]),  # sqrt(p), normalised: sqrt(.5) / 1.910633, ...
    (0.5, None, None, [0.724638, 0.181159, 0.065217, 0.028986]),  # p^2 / 0.345
    (1.0, 2, None, [2 / 3, 1 / 3, 0, 0]),  # 0.5 and 0.25, renormalised over 0.75
    (1.0, 3, None, [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0]),
    (1.0, 0, None, P),  # 0: no top-k
    (1.0, 9, None, P),  # more than the vocabulary: all of it
    (1.0, None, 0.6, [2 / 3, 1 / 3, 0, 0]),  # 0.5 < 0.6: the second token too; 0.75 reaches it
    (1.0, None, 0.8, [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0]),  # 0.75 < 0.8 <= 0.9
    (1.0, None, 0.3, [1, 0, 0, 0]),  # the first token alone reaches 0.3
    (1.0, None, 0.0, [1, 0, 0, 0]),  # nothing needed: the most likely token (greedy)
    (1.0, None, 1.0, P),  # 1: no top-p
    (0.5, None, 0.7, [1, 0, 0, 0]),  # temperature first: 0.7246 alone reaches 0.7 (at temperature 1 it would not)
    (1.0, 3, 0.6, [2 / 3, 1 / 3, 0, 0]),  # top-k first: 0.5556 < 0.6 <= 0.8333 of the renormalised three
    (1.0, 1, None, [1, 0, 0, 0]),
]


@pytest.mark.parametrize("temperature,top_k,top_p,want", BY_HAND,
                         ids=[f"T{t}-k{k}-p{p}" for t, k, p, _ in BY_HAND])
def test_the_filtered_distribution_is_the_one_worked_out_by_hand(temperature, top_k, top_p, want):
    got = sampling_probs(LOGITS, temperature, top_k, top_p)
    torch.testing.assert_close(got, torch.tensor([want], dtype=torch.float32), rtol=0, atol=2e-6)


def test_each_row_is_filtered_on_its_own():
    """Row 2 holds the same probabilities in another order: the same tokens are kept, at their own places."""
    logits = torch.cat([LOGITS, LOGITS[:, [3, 2, 1, 0]]])
    got = sampling_probs(logits, 1.0, 2, None)
    torch.testing.assert_close(got, torch.tensor([[2 / 3, 1 / 3, 0, 0], [0, 0, 1 / 3, 2 / 3]]), rtol=0, atol=2e-6)


@pytest.mark.parametrize("temperature,top_k,top_p,want", [BY_HAND[1], BY_HAND[3], BY_HAND[7], BY_HAND[13]],
                         ids=["temperature", "top_k", "top_p", "both"])
def test_the_sampler_draws_from_the_filtered_distribution(temperature, top_k, top_p, want):
    """20,000 draws of sample_next (one per row): a filtered token never, and the frequencies within 4.5 standard
    errors of the hand-worked probabilities (the draws are seeded: the same every run)."""
    n = 20_000
    torch.manual_seed(0)
    tokens = sample_next(LOGITS.expand(n, -1), temperature, top_k, top_p)
    assert tokens.shape == (n, 1)
    freq = torch.bincount(tokens[:, 0], minlength=4).double() / n
    for f, p in zip(freq.tolist(), want):
        if p == 0:
            assert f == 0
        else:
            assert abs(f - p) < 4.5 * math.sqrt(p * (1 - p) / n), (freq, want)


def test_temperature_zero_is_greedy_whatever_the_filters():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    for top_k, top_p in ((None, None), (1, 0.5), (3, 1.0)):
        assert sample_next(logits, 0, top_k, top_p).tolist() == [[1], [0]]


def test_a_vanishing_temperature_is_greedy_whatever_the_filters():
    """logits / 1e-300 overflows to inf (and 0 / 0 to NaN): the limit of a vanishing temperature, greedy decoding,
    not a NaN distribution."""
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.0], [3.0, 0.0, 2.9, -5.0], [-1.0, -2.0, -0.5, -3.0]])
    for temperature in (1e-300, 1e-45):
        for top_k, top_p in ((None, None), (1, 0.5), (3, 1.0), (200, 0.9)):
            assert sample_next(logits, temperature, top_k, top_p).tolist() == [[1], [0], [2]]
            assert sampling_probs(logits, temperature, top_k, top_p).tolist() == [[0, 1, 0, 0], [1, 0, 0, 0],
                                                                                  [0, 0, 1, 0]]


def test_sample_py_passes_its_filters_to_the_sampler(script, tmp_path, data_dir):
    """--top_k 1 and --top_p 0 leave one token each step, so that sampling at temperature 1 gives the greedy text;
    at --top_k 0 and --top_p 1 (no filter) it does not."""
    import train
    run = tmp_path / "run"
    train.main(["--data_dir", data_dir, "--out_dir", str(run), "--max_iters=10", "--n_layer=1", "--n_head=2",
                "--n_kv_head=1", "--n_embd=32", "--ffn_hidden=64", "--block_size=32", "--batch_size=4",
                "--eval_iters=1", "--device=cpu"])
    common = ["--out_dir", run, "--start", "ROMEO:", "--num_samples=1", "--max_new_tokens=60", "--device=cpu"]
    code, greedy, err = script("sample.py", *common, "--temperature=0")
    assert code == 0, err
    for filters in (["--top_k=1"], ["--top_k=0", "--top_p=0"]):
        code, out, err = script("sample.py", *common, "--temperature=1", *filters)
        assert code == 0 and out == greedy, (filters, out, greedy)
    code, out, _ = script("sample.py", *common, "--temperature=1", "--top_k=0", "--top_p=1")
    assert code == 0 and out != greedy
    code, out, err = script("sample.py", *common, "--temperature=1e-300")  # the smallest the option allows, nearly
    assert code == 0 and out == greedy, (out, err)
