"""RMSNorm's written-out gradient (RMSNormFunction, on every device but CUDA) against autograd's of the arithmetic
F.rms_norm runs: the same values bit for bit, the same gradients, in fewer operators."""
import pytest
import torch
import torch.nn.functional as F

from model_vanilla import RMSNorm, RMSNormFunction
from tools import kernels


def chained(x, weight, eps):
    """RMSNorm as F.rms_norm and autograd compute it (CUDA's branch of RMSNorm.forward)."""
    return F.rms_norm(x.to(torch.promote_types(x.dtype, torch.float32)), (x.size(-1),), eps=eps).type_as(x) * weight


def outputs(f, x, weight, dy):
    """(y, dL/dx, dL/dw) of f(x, weight) for the upstream gradient dy."""
    x = x.detach().clone().requires_grad_()
    weight.grad = None
    y = f(x, weight)
    y.backward(dy.to(y.dtype))
    return y.detach(), x.grad, None if weight.grad is None else weight.grad.clone()


def case(shape, x_dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, dy = (torch.randn(shape, generator=g) * 3).to(x_dtype), torch.randn(shape, generator=g)
    return x, torch.nn.Parameter(torch.randn(shape[-1], generator=g)), dy


@pytest.mark.parametrize("shape", [(5, 16), (2, 7, 32), (2, 3, 5, 8)])
def test_values_equal_and_gradients_agree(shape):
    x, w, dy = case(shape)
    (y, dx, dw), (y_ref, dx_ref, dw_ref) = (outputs(f, x, w, dy) for f in
                                            (lambda x, w: RMSNormFunction.apply(x, w, 1e-5),
                                             lambda x, w: chained(x, w, 1e-5)))
    assert torch.equal(y, y_ref)  # the forward is F.rms_norm's arithmetic, operator for operator
    torch.testing.assert_close(dx, dx_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dw, dw_ref, rtol=1e-5, atol=1e-5)


def test_the_gradient_formulas_pass_gradcheck_in_float64():
    x = torch.randn(3, 4, 10, dtype=torch.float64, requires_grad=True)
    w = torch.randn(10, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: RMSNormFunction.apply(x, w, 1e-5), (x, w))


def test_a_bfloat16_input_and_a_frozen_weight():
    """Under bf16 autocast q and k reach QK-norm in bfloat16: the output is float32 (times the float32 weight), and
    x's gradient comes back in bfloat16; a frozen weight gets no gradient."""
    x, w, dy = case((4, 6, 64), x_dtype=torch.bfloat16)
    w.requires_grad_(False)
    norm = RMSNorm(64, 1e-5)
    norm.weight = w
    (y, dx, dw), (y_ref, dx_ref, _) = (outputs(f, x, w, dy) for f in (lambda x, w: norm(x),
                                                                    lambda x, w: chained(x, w, 1e-5)))
    assert y.dtype == torch.float32 and dx.dtype == torch.bfloat16 and dw is None
    assert torch.equal(y, y_ref)
    torch.testing.assert_close(dx.float(), dx_ref.float(), rtol=2e-2, atol=2e-2)


def test_fewer_operators_than_autograds_chain():
    x, w, _ = case((2, 8, 64))
    x.requires_grad_()

    def operators(f):
        f(x, w).sum().backward()  # once before counting
        return sum(kernels.count(lambda: f(x, w).sum().backward()).values())

    written, chain = (operators(f) for f in (lambda x, w: RMSNormFunction.apply(x, w, 1e-5),
                                             lambda x, w: chained(x, w, 1e-5)))
    assert written <= chain - 6, (written, chain)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (F.rms_norm's fused kernel)")
def test_cuda_takes_f_rms_norm_and_agrees_with_the_cpu():
    x, w, dy = case((4, 32, 256))
    norm = RMSNorm(256, 1e-5)
    norm.weight = w
    cpu = outputs(lambda x, w: norm(x), x, w, dy)
    norm.cuda()
    gpu = outputs(lambda x, w: norm(x), x.cuda(), norm.weight, dy.cuda())
    assert norm(x.cuda()).grad_fn.name() != "RMSNormFunctionBackward"
    for a, b in zip(cpu, gpu):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-4, atol=1e-4)
