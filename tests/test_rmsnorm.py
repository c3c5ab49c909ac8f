"""RMSNorm against a float64 re-computation of its definition, y = x / sqrt(mean(x^2) + eps) * w over each row:
values and gradients, for float32 and bfloat16 inputs (a bf16 x is normalised in float32, then rounded once)."""
import pytest
import torch

from model_vanilla import RMSNorm

EPS = 1e-5


def case(dtype, seed=0):
    """An RMSNorm over 64 channels with a random weight, an input x (4, 6, 64) of dtype whose rows have scales from
    1e-3 (mean(x^2) well under eps) to 10, and an upstream gradient."""
    g = torch.Generator().manual_seed(seed)
    norm = RMSNorm(64, EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=g))
    scale = 10 ** torch.linspace(-3, 1, 24).view(4, 6, 1)
    x = (torch.randn(4, 6, 64, generator=g) * scale).to(dtype).requires_grad_()
    return norm, x, torch.randn(4, 6, 64, generator=g)


def normalised(x):
    """x / sqrt(mean(x^2) + eps) over the last axis, in x's dtype."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def reference(x, w, dy):
    """(y, dL/dx, dL/dw) of normalised(x) * w in float64, from the same (already rounded) x, each with the size its
    rounding errors scale with: |y|; for dL/dx, where a row's terms cancel, a part of its row's largest; for
    dL/dw, a sum over rows, the sum of its terms' sizes."""
    x, w = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y = normalised(x) * w
    y.backward(dy.double())
    terms = (dy.double() * normalised(x.detach())).abs().flatten(0, -2).sum(0)
    return ((y.detach(), y.detach().abs()), (x.grad, x.grad.abs() + x.grad.abs().amax(-1, keepdim=True) / 8),
            (w.grad, terms))


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-6), (torch.bfloat16, 2 ** -7)], ids=["f32", "bf16"])
def test_values_and_gradients_equal_the_float64_definition(dtype, rtol):
    """float32 to float32 rounding; bfloat16 to its own: the normalised x and the gradient reaching it are each
    rounded once to bf16 (y is the float32 weight times a bf16 tensor), so rtol is one bf16 step."""
    norm, x, dy = case(dtype)
    y = norm(x)
    y.backward(dy)
    assert y.dtype == torch.float32 and x.grad.dtype == dtype  # x's gradient comes back in x's dtype
    for got, (want, size) in zip((y, x.grad, norm.weight.grad), reference(x, norm.weight, dy)):
        assert ((got.double() - want).abs() <= rtol * size).all()


def test_a_bfloat16_input_is_normalised_in_float32():
    """Under bf16 autocast q and k reach QK-norm in bfloat16: the result is the exact normalised x rounded once to
    bf16, times w, as promoting to float32 first gives; normalising in bf16 itself rounds at every step and
    lands elsewhere in about one element in six."""
    norm, x, _ = case(torch.bfloat16)
    with torch.no_grad():
        w = norm.weight
        rounded_once = normalised(x.double()).to(torch.bfloat16).float() * w
        in_bf16 = normalised(x).float() * w

        def off(y):
            return (y != rounded_once).float().mean().item()
        assert off(norm(x)) < 0.01 and off(in_bf16) > 0.1
