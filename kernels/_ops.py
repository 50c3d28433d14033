"""torch.library registration of the fused ops, with their fake kernels and autograd.

Importing this module registers (the public ops import it when they first use a fast backend):

- ``wc_fast::nft_loss_fwd`` and ``wc_fast::flow_noise``: Triton on CUDA; on CPU the native
  kernel (``wc_kernels._native``) when it is built, else Triton under ``TRITON_INTERPRET=1``.
- ``wc_fast::nft_loss_fwd_triton`` and ``wc_fast::flow_noise_triton``: Triton on every device,
  so that ``backend="triton"`` reaches the Triton kernels on CPU tensors even when the native
  kernel owns the CPU dispatch key of the main op.

Every op of a pair gets the same fake kernel and the same autograd formula. The Triton
implementations are ``torch.library.triton_op`` so ``torch.compile`` sees (and Inductor can
compile) the kernels; under the interpreter they are opaque custom ops. Without ``triton``
installed only the native CPU kernels are registered; with neither, no op is.

Signatures (all tensors 2-D, rows flattened by the public ops in :mod:`wc_kernels.nft_loss` and
:mod:`wc_kernels.flow_noise`):

- ``nft_loss_fwd(v_theta, v_old, v_target [B, D], r [B], sigma [B] | None, beta, x0,
  grad_scale=1.0) -> (loss [B] fp32 (fp64 for fp64 inputs), grad [B, D])`` with
  ``grad[i] = grad_scale * dL_i/dv_theta[i]``. Backward:
  ``dv_theta = grad * (grad_loss / grad_scale)[:, None]``; the other inputs get no gradient.
  The public op passes the factor its reduction will apply as ``grad_scale``, so for the usual
  ``loss.backward()`` the factor is 1 and the saved gradient is the answer: on CPU that is
  checked and the multiply skipped (on CUDA the check would synchronise, and traced graphs
  cannot branch on values, so there the multiply always runs).
- ``flow_noise(x0 [S, D], sigmas [S, K], noise [S*K, D]) -> (x_t, v_target [S*K, D])``.
  Backward: ``dx0[s] = sum_j (1 - sig[s, j]) g_xt[s*K+j] - g_v[s*K+j]``,
  ``dnoise = sig * g_xt + g_v``, ``dsigmas[s, j] = <g_xt[s*K+j], noise[s*K+j] - x0[s]>``.

Shared-prefix attention (Triton on every device, in ``ATTENTION_OPS``; see
:mod:`wc_kernels._triton.prefix_attention`):

- ``wc_fast::prefix_attention_fwd(q [B, H, L, D], k, v [B, H, Lk, D], prefix_k, prefix_v
  [1, H, P, D], scale) -> (out [B, H, L, D], lse [B, H, L] fp32)``. Backward:
  ``wc_fast::prefix_attention_bwd(grad_out, q, k, v, prefix_k, prefix_v, out, lse, scale)
  -> (dq, dk, dv, dprefix_k, dprefix_v)``; ``lse`` gets no gradient.

GRPO's SDE loss (in ``GRPO_OPS``, with ``_triton`` twins as above; see
:mod:`wc_kernels._triton.grpo_sde_loss`):

- ``wc_fast::sde_residual_sums(model_output, sample, prev_sample [B, D], ref_output [B, D] |
  None, coef [B, 2]) -> sums [B, 2]`` (fp32, fp64 for fp64 inputs) with
  ``sums[:, 0] = sum((prev_sample - a sample - c model_output)^2)`` and
  ``sums[:, 1] = sum((model_output - ref_output)^2)`` (0 without a ref), ``coef = (a, c)``.
  Backward: ``wc_fast::sde_residual_sums_bwd(weights, model_output, sample, prev_sample,
  ref_output, coef)`` with ``weights = grad_sums * (-2c, 2)``; only ``model_output`` gets a
  gradient.
"""

from typing import Any

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from wc_kernels._backend import native_built, triton_interpreting
from wc_kernels.reference import compute_dtype

try:
    import triton  # noqa: F401
except ImportError:
    HAVE_TRITON = False
else:
    HAVE_TRITON = True

NFT_LOSS = "wc_fast::nft_loss_fwd"
FLOW_NOISE = "wc_fast::flow_noise"
PREFIX_ATTENTION = "wc_fast::prefix_attention_fwd"
PREFIX_ATTENTION_BWD = "wc_fast::prefix_attention_bwd"
SDE_SUMS = "wc_fast::sde_residual_sums"
SDE_SUMS_BWD = "wc_fast::sde_residual_sums_bwd"
TRITON_TWIN = "_triton"


# nft_loss_fwd -----------------------------------------------------------------------------

def _nft_native(v_theta: Tensor, v_old: Tensor, v_target: Tensor, r: Tensor,
                sigma: Tensor | None, beta: float, x0: bool, grad_scale: float = 1.0
                ) -> tuple[Tensor, Tensor]:
    from wc_kernels import _native

    sig = None if sigma is None else sigma.to(torch.float32).contiguous()
    return _native.nft_loss_fwd(v_theta.contiguous(), v_old.contiguous(), v_target.contiguous(),
                                r.to(torch.float32).contiguous(), sig, beta, x0, grad_scale)


def _nft_fake(v_theta: Tensor, v_old: Tensor, v_target: Tensor, r: Tensor,
              sigma: Tensor | None, beta: float, x0: bool, grad_scale: float = 1.0
              ) -> tuple[Tensor, Tensor]:
    loss = v_theta.new_empty(v_theta.shape[0], dtype=compute_dtype(v_theta.dtype))
    return loss, torch.empty_like(v_theta, memory_format=torch.contiguous_format)


def _nft_setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])
    # the gradient output gets no upstream gradient: without this, autograd would fill a
    # [B, D] tensor of zeros for it on every backward (a full pass, for nothing)
    ctx.set_materialize_grads(False)
    ctx.grad_scale = inputs[7] if len(inputs) > 7 else 1.0


def _upstream_is_grad_scale(grad_loss: Tensor, grad_scale: float) -> bool:
    """Whether every row's upstream gradient equals the factor the forward already applied
    (checked on the host, so only for CPU tensors outside tracing; see the module doc)."""
    if grad_loss.device.type != "cpu" or torch.compiler.is_compiling() or is_fake(grad_loss):
        return False
    return bool((grad_loss == grad_scale).all())


def _nft_backward(ctx: Any, grad_loss: Tensor | None, _grad_grad: Tensor | None) -> tuple:
    (grad,) = ctx.saved_tensors
    if grad_loss is None:
        dv_theta = None
    elif _upstream_is_grad_scale(grad_loss, ctx.grad_scale):
        dv_theta = grad
    else:
        factor = (grad_loss / ctx.grad_scale).unsqueeze(1)
        dv_theta = (grad.to(grad_loss.dtype) * factor).to(grad.dtype)
    return dv_theta, None, None, None, None, None, None, None


# flow_noise --------------------------------------------------------------------------------

def _flow_native(x0: Tensor, sigmas: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    from wc_kernels import _native

    return _native.flow_noise(x0.contiguous(), sigmas.to(torch.float32).contiguous(),
                              noise.contiguous())


def _flow_fake(x0: Tensor, sigmas: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    shape = (sigmas.shape[0] * sigmas.shape[1], x0.shape[1])
    return x0.new_empty(shape), x0.new_empty(shape)


def _flow_setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(*inputs)


def _flow_backward(ctx: Any, g_xt: Tensor, g_v: Tensor) -> tuple:
    x0, sigmas, noise = ctx.saved_tensors
    acc = compute_dtype(x0.dtype)
    (s, k), d = sigmas.shape, x0.shape[1]
    sig = sigmas.to(acc).reshape(s, k, 1)
    g_xt, g_v = g_xt.to(acc).reshape(s, k, d), g_v.to(acc).reshape(s, k, d)
    d_x0 = d_sig = d_noise = None
    if ctx.needs_input_grad[0]:
        d_x0 = ((1.0 - sig) * g_xt - g_v).sum(dim=1).to(x0.dtype)
    if ctx.needs_input_grad[1]:
        v_target = noise.to(acc).reshape(s, k, d) - x0.to(acc).unsqueeze(1)
        d_sig = (g_xt * v_target).sum(dim=2).to(sigmas.dtype)
    if ctx.needs_input_grad[2]:
        d_noise = (sig * g_xt + g_v).reshape(s * k, d).to(noise.dtype)
    return d_x0, d_sig, d_noise


# prefix_attention --------------------------------------------------------------------------

def _attn_fake(q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor, prefix_v: Tensor,
               scale: float) -> tuple[Tensor, Tensor]:
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty(q.shape[:3], dtype=torch.float32)


def _attn_bwd_fake(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, prefix_k: Tensor,
                   prefix_v: Tensor, out: Tensor, lse: Tensor, scale: float
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                 for t in (q, k, v, prefix_k, prefix_v))


def _attn_setup_context(ctx: Any, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    *tensors, scale = inputs
    ctx.save_for_backward(*tensors, *output)
    ctx.scale = scale
    ctx.mark_non_differentiable(output[1])


def _attn_backward(ctx: Any, grad_out: Tensor, _grad_lse: Tensor | None) -> tuple:
    backward = ATTENTION_OPS[PREFIX_ATTENTION_BWD]
    return (*backward(grad_out, *ctx.saved_tensors, ctx.scale), None)


def _define_attention() -> None:
    from wc_kernels._triton.prefix_attention import prefix_attention_bwd, prefix_attention_fwd

    backward = _define(PREFIX_ATTENTION_BWD, prefix_attention_bwd, None, native=False)
    backward.register_fake(_attn_bwd_fake)
    forward = _define(PREFIX_ATTENTION, prefix_attention_fwd, None, native=False)
    forward.register_fake(_attn_fake)
    forward.register_autograd(_attn_backward, setup_context=_attn_setup_context)
    ATTENTION_OPS[PREFIX_ATTENTION_BWD] = backward
    ATTENTION_OPS[PREFIX_ATTENTION] = forward


# sde_residual_sums -------------------------------------------------------------------------

def _sde_fake(model_output: Tensor, sample: Tensor, prev_sample: Tensor,
              ref_output: Tensor | None, coef: Tensor) -> Tensor:
    return model_output.new_empty((model_output.shape[0], 2),
                                  dtype=compute_dtype(model_output.dtype))


def _sde_bwd_fake(weights: Tensor, model_output: Tensor, sample: Tensor, prev_sample: Tensor,
                  ref_output: Tensor | None, coef: Tensor) -> Tensor:
    return torch.empty_like(model_output, memory_format=torch.contiguous_format)


def _sde_setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
    model_output, sample, prev_sample, ref_output, coef = inputs
    ctx.has_ref = ref_output is not None
    ctx.save_for_backward(model_output, sample, prev_sample,
                          ref_output if ctx.has_ref else None, coef)


def _sde_backward(backward: Any, ctx: Any, grad_sums: Tensor) -> tuple:
    """``backward`` is the ``sde_residual_sums_bwd`` op paired with the forward."""
    model_output, sample, prev_sample, ref_output, coef = ctx.saved_tensors
    d_model = None
    if ctx.needs_input_grad[0]:
        # dS1/dm = -2c * residual, dS2/dm = 2 (m - r): fold the row factors into the weights
        factors = torch.stack([-2.0 * coef[:, 1], torch.full_like(coef[:, 1], 2.0)], dim=1)
        weights = grad_sums.to(coef.dtype) * factors
        d_model = backward(weights, model_output, sample, prev_sample, ref_output, coef)
    return d_model, None, None, None, None


def _sde_native(model_output: Tensor, sample: Tensor, prev_sample: Tensor,
                ref_output: Tensor | None, coef: Tensor) -> Tensor:
    from wc_kernels import _native

    ref = None if ref_output is None else ref_output.contiguous()
    return _native.sde_residual_sums(model_output.contiguous(), sample.contiguous(),
                                     prev_sample.contiguous(), ref, coef.contiguous())


def _sde_bwd_native(weights: Tensor, model_output: Tensor, sample: Tensor, prev_sample: Tensor,
                    ref_output: Tensor | None, coef: Tensor) -> Tensor:
    from wc_kernels import _native

    ref = None if ref_output is None else ref_output.contiguous()
    return _native.sde_residual_sums_bwd(weights.contiguous(), model_output.contiguous(),
                                         sample.contiguous(), prev_sample.contiguous(), ref,
                                         coef.contiguous())


def _define_grpo(suffix: str, native: bool) -> None:
    """``sde_residual_sums`` + ``suffix`` and its backward op into ``GRPO_OPS``."""
    launch = launch_bwd = None
    if HAVE_TRITON:
        from wc_kernels._triton.grpo_sde_loss import sde_residual_sums as launch
        from wc_kernels._triton.grpo_sde_loss import sde_residual_sums_bwd as launch_bwd
    backward = _define(SDE_SUMS_BWD + suffix, launch_bwd, _sde_bwd_native, native)
    backward.register_fake(_sde_bwd_fake)
    forward = _define(SDE_SUMS + suffix, launch, _sde_native, native)
    forward.register_fake(_sde_fake)
    forward.register_autograd(lambda ctx, grad: _sde_backward(backward, ctx, grad),
                              setup_context=_sde_setup_context)
    GRPO_OPS[SDE_SUMS_BWD + suffix] = backward
    GRPO_OPS[SDE_SUMS + suffix] = forward


# registration ------------------------------------------------------------------------------

def _define(name: str, launch: Any, native_impl: Any, native: bool) -> Any:
    """Op ``name`` running the Triton ``launch`` (on CPU: ``native_impl`` when ``native``).

    Under ``TRITON_INTERPRET=1`` the kernels are plain Python that cannot be traced, so the op
    is an opaque ``custom_op`` there (compiled graphs call it and use its fake kernel).
    """
    if not HAVE_TRITON:
        return torch.library.custom_op(name, native_impl, mutates_args=(), device_types="cpu")
    interpreting = triton_interpreting()
    define = torch.library.custom_op if interpreting else torch.library.triton_op
    op = define(name, launch, mutates_args=())
    if native:
        op.register_kernel("cpu", native_impl)
        if not interpreting:
            _opaque_on_cpu(op)
    return op


def _opaque_on_cpu(op: Any) -> None:
    """Keep a ``triton_op`` whole for CPU tensors when torch.compile functionalizes it.

    A ``triton_op`` decomposes into its Triton kernels under ``FunctionalTensorMode`` whatever
    the device; CPU tensors run the native kernel instead, so for them the op stays one node.
    """
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    decompose = op._torch_dispatch_fns[FunctionalTensorMode]

    def dispatch(mode: Any, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        first = args[0] if args else next(iter(kwargs.values()))
        if first.device.type == "cpu":
            return mode.__torch_dispatch__(func, types, args, kwargs)
        return decompose(mode, func, types, args, kwargs)

    op.register_torch_dispatch(FunctionalTensorMode, dispatch)


def _define_nft(name: str, native: bool) -> Any:
    launch = None
    if HAVE_TRITON:
        from wc_kernels._triton.nft_loss import nft_loss_fwd as launch
    op = _define(name, launch, _nft_native, native)
    op.register_fake(_nft_fake)
    op.register_autograd(_nft_backward, setup_context=_nft_setup_context)
    return op


def _define_flow(name: str, native: bool) -> Any:
    launch = None
    if HAVE_TRITON:
        from wc_kernels._triton.flow_noise import flow_noise as launch
    op = _define(name, launch, _flow_native, native)
    op.register_fake(_flow_fake)
    op.register_autograd(_flow_backward, setup_context=_flow_setup_context)
    return op


NATIVE = native_built()
OPS: dict[str, Any] = {}  # the elementwise ops and their Triton twins
ATTENTION_OPS: dict[str, Any] = {}  # shared-prefix attention, Triton only
GRPO_OPS: dict[str, Any] = {}  # GRPO's SDE residual sums and their twins
if HAVE_TRITON or NATIVE:
    OPS[NFT_LOSS] = _define_nft(NFT_LOSS, NATIVE)
    OPS[FLOW_NOISE] = _define_flow(FLOW_NOISE, NATIVE)
    _define_grpo("", NATIVE)
if HAVE_TRITON:
    OPS[NFT_LOSS + TRITON_TWIN] = _define_nft(NFT_LOSS + TRITON_TWIN, native=False)
    OPS[FLOW_NOISE + TRITON_TWIN] = _define_flow(FLOW_NOISE + TRITON_TWIN, native=False)
    _define_grpo(TRITON_TWIN, native=False)
    _define_attention()


def op_for(name: str, backend: str, device: torch.device, ops: dict[str, Any] | None = None
           ) -> Any:
    """The registered op of ``ops`` (default :data:`OPS`) that runs ``backend`` ("triton" or
    "native") for ``device`` tensors."""
    twin = backend == "triton" and device.type == "cpu"
    return (OPS if ops is None else ops)[name + TRITON_TWIN if twin else name]
