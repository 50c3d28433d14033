"""TinyWorldDiT: shared-cache batching, block-causal cache, gradients, shape errors."""

import dataclasses

import pytest
import torch

from wc_fast.actions import action_id
from wc_fast.config import ModelConfig
from wc_fast.models import PROMPT_ACTION, ContextCache, TinyWorldDiT, WorldModel

CFG = ModelConfig(resolution=16, channels=3, clip_frames=2, patch=4, dim=48, depth=2, heads=3)


def _model(cfg: ModelConfig = CFG, backend: str = "auto", seed: int = 0) -> TinyWorldDiT:
    """A model whose zero-initialised (adaLN-Zero) layers are randomised, so every path matters."""
    torch.manual_seed(seed)
    model = TinyWorldDiT(cfg, attention_backend=backend).double()
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(std=0.1)
    return model


def _history(clips: int, cfg: ModelConfig = CFG, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    frames = torch.randn(1, 1 + clips * cfg.clip_frames, 3, cfg.resolution, cfg.resolution,
                         generator=g, dtype=torch.float64)
    actions = torch.randint(0, 81, (1, frames.shape[1]), generator=g)
    return frames, actions


def test_is_a_world_model():
    assert isinstance(_model(), WorldModel)


def test_batched_candidates_equal_separate_forwards_with_own_cache_copies():
    model = _model()
    frames, actions = _history(2)
    cache = model.extend_cache(model.empty_cache(), frames, actions, sigma=0.014)
    g = 5
    x = torch.randn(g, 2, 3, 16, 16, dtype=torch.float64)
    sigma = torch.rand(g, dtype=torch.float64)
    clip_actions = torch.randint(0, 81, (g, 2))
    with torch.no_grad():
        batched = model.velocity(x, sigma, clip_actions, cache)
        for i in range(g):
            own = ContextCache([k.clone() for k in cache.keys], [v.clone() for v in cache.values],
                               cache.num_frames, cache.signature, cache.last_frame.clone())
            single = model.velocity(x[i:i + 1], sigma[i:i + 1], clip_actions[i:i + 1], own)
            torch.testing.assert_close(batched[i:i + 1], single, rtol=1e-10, atol=1e-10)


def test_shared_prefix_backends_agree_with_replicated_reference():
    frames, actions = _history(2)
    x = torch.randn(3, 2, 3, 16, 16, dtype=torch.float64)
    sigma = torch.rand(3, dtype=torch.float64)
    outs = []
    for backend in ("reference", "split"):
        model = _model(backend=backend)
        cache = model.extend_cache(model.empty_cache(), frames, actions, sigma=0.014)
        with torch.no_grad():
            outs.append(model.velocity(x, sigma, actions[0, 1:3], cache))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-9, atol=1e-9)


def test_clip_by_clip_cache_equals_one_block_causal_forward():
    model = _model()
    frames, actions = _history(3)
    with torch.no_grad():
        step = model.empty_cache()
        step = model.extend_cache(step, frames[:, :1], actions[:, :1], sigma=0.014)
        for c in range(3):
            sl = slice(1 + 2 * c, 3 + 2 * c)
            step = model.extend_cache(step, frames[:, sl], actions[:, sl], sigma=0.014)
        parallel = model.build_cache_parallel(frames, actions, sigma=0.014)
    assert step.num_frames == parallel.num_frames == 7
    assert step.num_tokens == 7 * model.tokens_per_frame
    for a, b in zip(step.keys + step.values, parallel.keys + parallel.values, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_history_changes_the_prediction_but_future_history_does_not_leak():
    model = _model()
    frames, actions = _history(2)
    x = torch.randn(2, 2, 3, 16, 16, dtype=torch.float64)
    sigma = torch.full((2,), 0.5, dtype=torch.float64)
    with torch.no_grad():
        c1 = model.extend_cache(model.empty_cache(), frames, actions, sigma=0.0)
        altered = frames.clone()
        altered[:, 1:3] += 1.0
        c2 = model.extend_cache(model.empty_cache(), altered, actions, sigma=0.0)
        assert not torch.allclose(model.velocity(x, sigma, actions[0, :2], c1),
                                  model.velocity(x, sigma, actions[0, :2], c2))
        short = model.extend_cache(model.empty_cache(), frames[:, :3], actions[:, :3], sigma=0.0)
        longer = model.extend_cache(model.empty_cache(), frames, actions, sigma=0.0)
    for a, b in zip(short.keys, longer.keys, strict=True):
        torch.testing.assert_close(a, b[:, :, : a.shape[2]])


@pytest.mark.parametrize("context_grad", [False, True])
def test_gradients_reach_parameters(context_grad):
    model = _model()
    frames, actions = _history(1)
    with torch.set_grad_enabled(context_grad):
        cache = model.extend_cache(model.empty_cache(), frames, actions, sigma=0.014)
    assert cache.keys[0].requires_grad == context_grad
    x = torch.randn(3, 2, 3, 16, 16, dtype=torch.float64)
    sigma = torch.rand(3, dtype=torch.float64)
    out = model.velocity(x, sigma, actions[0, 1:], cache)
    out.square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert grads["blocks.1.attn.qkv.weight"].abs().sum() > 0
    # the gradient along a random direction of one weight equals the central difference of
    # the loss (float64); the history cache is rebuilt with the moved weight exactly when the
    # gradient flows through it
    weight = dict(model.named_parameters())["blocks.1.attn.qkv.weight"]
    direction = torch.randn_like(weight)
    with torch.no_grad():
        losses = []
        for step in (1e-6, -1e-6):
            weight.add_(step * direction)
            moved = (model.extend_cache(model.empty_cache(), frames, actions, sigma=0.014)
                     if context_grad else cache)
            losses.append(model.velocity(x, sigma, actions[0, 1:], moved).square().mean())
            weight.sub_(step * direction)
    numeric = (losses[0] - losses[1]) / 2e-6
    torch.testing.assert_close(numeric, (grads["blocks.1.attn.qkv.weight"] * direction).sum(),
                               rtol=1e-6, atol=1e-9)
    # the prompt-frame embedding is used only by the history: it learns only through the cache
    prompt_grad = grads["key_embed.weight"][:, 8].abs().sum()
    assert (prompt_grad > 0) == context_grad


def test_zero_initialised_model_predicts_zero_velocity():
    model = TinyWorldDiT(CFG)
    x = torch.randn(2, 2, 3, 16, 16)
    out = model.velocity(x, torch.rand(2), torch.tensor([1, 2]), model.empty_cache())
    assert out.shape == x.shape and out.abs().max() == 0


def test_bad_inputs_raise_clear_errors():
    model = _model()
    frames, actions = _history(1)
    cache = model.extend_cache(model.empty_cache(), frames, actions, sigma=0.014)
    x = torch.randn(2, 2, 3, 16, 16, dtype=torch.float64)
    sigma = torch.rand(2, dtype=torch.float64)
    other = _model(ModelConfig(resolution=16, clip_frames=2, patch=4, dim=24, depth=2, heads=3))
    with pytest.raises(ValueError, match="cache was built by a model with sizes"):
        other.velocity(x.float(), sigma.float(), torch.tensor([0, 0]), cache)
    with pytest.raises(ValueError, match="action ids must lie in 0..80"):
        model.velocity(x, sigma, torch.tensor([0, 99]), cache)
    with pytest.raises(TypeError, match="actions must be integer ids"):
        model.velocity(x, sigma, torch.tensor([0.0, 1.0]), cache)
    with pytest.raises(ValueError, match="one clip of 2 frames"):
        model.velocity(x[:, :1], sigma, torch.tensor([0]), cache)
    with pytest.raises(ValueError, match=r"multiple of the clip length 2"):
        model.extend_cache(cache, frames[:, :3], actions[:, :3], sigma=0.014)
    with pytest.raises(ValueError, match=r"1 prompt frame plus a multiple"):
        model.extend_cache(model.empty_cache(), frames[:, :2], actions[:, :2], sigma=0.014)
    with pytest.raises(ValueError, match=r"must have shape \[B, F, 3, 16, 16\]"):
        model.velocity(torch.randn(2, 2, 3, 8, 8), sigma, torch.tensor([0, 0]), cache)
    with pytest.raises(ValueError, match=r"sigma must be a tensor of shape \[2\]"):
        model.velocity(x, sigma[:1], torch.tensor([0, 0]), cache)
    with pytest.raises(ValueError, match="batch must be 1"):
        model.extend_cache(model.empty_cache(), frames.expand(2, -1, -1, -1, -1),
                           actions.expand(2, -1), sigma=0.014)


@pytest.mark.parametrize("prediction", ["velocity", "x0", "warp"])
def test_teacher_forced_velocity_equals_cached_velocity_per_clip(prediction):
    model = _model(dataclasses.replace(CFG, prediction=prediction))
    frames, _ = _history(3)
    g = torch.Generator().manual_seed(7)
    b = 2
    frames = frames.expand(b, -1, -1, -1, -1).clone()
    frames[1] += 0.3
    actions = torch.randint(0, 81, (b, 6), generator=g)
    x_t = torch.randn(b, 6, 3, 16, 16, generator=g, dtype=torch.float64)
    sigma = torch.rand(b, 3, generator=g, dtype=torch.float64)
    with torch.no_grad():
        tf = model.teacher_forced_velocity(frames, actions, x_t, sigma, context_sigma=0.02)
        for row in range(b):
            hist_actions = torch.cat([torch.zeros(1, 1, dtype=torch.long), actions[row:row + 1]],
                                     dim=1)
            for j in range(3):
                cache = model.extend_cache(model.empty_cache(), frames[row:row + 1, :1 + 2 * j],
                                           hist_actions[:, :1 + 2 * j], sigma=0.02)
                clip = slice(2 * j, 2 * j + 2)
                want = model.velocity(x_t[row:row + 1, clip], sigma[row:row + 1, j],
                                      actions[row:row + 1, clip], cache)
                torch.testing.assert_close(tf[row:row + 1, clip], want, rtol=1e-9, atol=1e-9)


def test_reference_frame_of_each_history_frame_is_the_last_frame_before_its_chunk():
    model = _model()
    f = model.clip_frames
    # frame i holds the value i + 1
    frames = torch.arange(1, 2 + 2 * f, dtype=torch.float64)[None, :, None, None, None].expand(
        1, -1, 3, 16, 16)
    ref = model._sequence_reference(frames)[0, :, 0, 0, 0]
    # zeros for the prompt; clip 1 refers to the prompt (frame 0), clip 2 to frame f
    assert ref.tolist() == [0.0] + [1.0] * f + [float(f + 1)] * f


def test_x0_prediction_is_read_as_the_clean_clip():
    """An x0-predicting model's velocity is (x_t - head) / max(sigma, 0.05): one Euler step to
    sigma = 0 lands exactly on the head's output, whatever sigma the step starts from."""
    x0_model = _model(dataclasses.replace(CFG, prediction="x0"))
    v_model = _model(CFG)
    v_model.load_state_dict(x0_model.state_dict())  # same weights: v_model returns the head
    frames, actions = _history(1)
    cache = x0_model.extend_cache(x0_model.empty_cache(), frames, actions, sigma=0.014)
    g = torch.Generator().manual_seed(3)
    x_t = torch.randn(3, 2, 3, 16, 16, generator=g, dtype=torch.float64)
    sigma = torch.tensor([0.9, 0.3, 0.01], dtype=torch.float64)
    with torch.no_grad():
        head = v_model.velocity(x_t, sigma, actions[0, 1:], cache)
        v = x0_model.velocity(x_t, sigma, actions[0, 1:], cache)
    torch.testing.assert_close(x_t[:2] - sigma[:2, None, None, None, None] * v[:2], head[:2],
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(v[2], (x_t[2] - head[2]) / 0.05, rtol=1e-12, atol=1e-12)


def test_prediction_must_be_a_known_kind():
    from wc_fast.config import from_dict, preset, to_dict

    cfg = to_dict(preset("smoke"))
    cfg["model"]["prediction"] = "eps"
    with pytest.raises(ValueError, match="model.prediction"):
        from_dict(cfg)


def test_warp_shifts_by_whole_pixels_exactly_and_keeps_zero_flow_identity():
    from wc_fast.models.tiny.dit import warp

    frames = torch.randn(2, 3, 3, 8, 8, dtype=torch.float64)
    flow = torch.zeros(2, 3, 2, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(warp(frames, flow), frames, rtol=0, atol=1e-12)
    flow[:, :, 0] = 2.0  # sample two pixels to the right: the image moves left
    out = warp(frames, flow)
    torch.testing.assert_close(out[..., :6], frames[..., 2:], rtol=0, atol=1e-12)
    torch.testing.assert_close(out[..., 6:], frames[..., 7:].expand_as(out[..., 6:]),
                               rtol=0, atol=1e-12)  # border values past the edge


def test_affine_flow_is_a_shift_plus_a_linear_field_about_the_image_centre():
    from wc_fast.models.tiny.dit import affine_flow

    params = torch.zeros(2, 3, 6, dtype=torch.float64)
    params[0, 1] = torch.tensor([1.5, 0, 0, -2.0, 0, 0], dtype=torch.float64)  # a pure shift
    params[1, 2] = torch.tensor([0, 0.1, 0, 0, 0, 0.1], dtype=torch.float64)  # a zoom
    flow = affine_flow(params, 8)
    assert flow.shape == (2, 3, 2, 8, 8)
    assert torch.equal(flow[0, 1, 0], torch.full((8, 8), 1.5, dtype=torch.float64))
    assert torch.equal(flow[0, 1, 1], torch.full((8, 8), -2.0, dtype=torch.float64))
    assert not flow[0, 0].any() and not flow[1, :2].any()
    offsets = torch.arange(8, dtype=torch.float64) - 3.5  # pixel centres minus the centre
    torch.testing.assert_close(flow[1, 2, 0], 0.1 * offsets.expand(8, 8), rtol=0, atol=1e-15)
    torch.testing.assert_close(flow[1, 2, 1], 0.1 * offsets[:, None].expand(8, 8), rtol=0,
                               atol=1e-15)


def test_untrained_warp_model_predicts_the_reference_frame():
    """Zero-initialised head: no flow, no residual, so the clean-clip estimate is the last
    history frame and a one-step sample from any sigma copies it."""
    cfg = dataclasses.replace(CFG, prediction="warp")
    torch.manual_seed(0)
    model = TinyWorldDiT(cfg).double()
    frames, actions = _history(1)
    cache = model.extend_cache(model.empty_cache(), frames, actions, sigma=0.014)
    x_t = torch.randn(2, 2, 3, 16, 16, dtype=torch.float64)
    sigma = torch.tensor([0.7, 0.2], dtype=torch.float64)
    with torch.no_grad():
        v = model.velocity(x_t, sigma, actions[0, 1:], cache)
    x0 = x_t - sigma[:, None, None, None, None] * v
    torch.testing.assert_close(x0, frames[:, -1:].expand_as(x0), rtol=1e-12, atol=1e-12)


def test_warp_needs_reference_frames():
    with pytest.raises(ValueError, match="reference_frame"):
        TinyWorldDiT(dataclasses.replace(CFG, prediction="warp", reference_frame=False))
    with pytest.raises(ValueError, match="model.prediction must be one of"):
        TinyWorldDiT(dataclasses.replace(CFG, prediction="eps"))


@pytest.mark.parametrize("prediction", ["velocity", "x0", "warp"])
def test_bfloat16_autocast_model_tracks_the_fp32_model(prediction):
    """``model.dtype='bfloat16'`` runs the matmuls under autocast, every head included, and
    returns fp32 velocities close to the fp32 model's with the same weights."""
    cfg = dataclasses.replace(CFG, prediction=prediction)
    exact = _model(cfg).float()
    fast = TinyWorldDiT(dataclasses.replace(cfg, dtype="bfloat16"))
    fast.load_state_dict(exact.state_dict())
    frames, actions = _history(1)
    x = torch.randn(3, 2, 3, 16, 16)
    sigma = torch.tensor([0.9, 0.5, 0.1])
    outs = []
    for model in (exact, fast):
        cache = model.extend_cache(model.empty_cache(), frames.float(), actions, sigma=0.014)
        with torch.no_grad():
            outs.append(model.velocity(x, sigma, actions[0, 1:], cache))
    assert outs[1].dtype == torch.float32 and outs[1].isfinite().all()
    scale = outs[0].abs().mean()
    assert (outs[1] - outs[0]).abs().mean() < 0.05 * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tanh_gelu_compiled_sigmoid_form_equals_the_eager_tanh_form(dtype):
    from wc_fast.models.tiny.dit import TanhGELU

    gelu = TanhGELU()
    x = (4 * torch.randn(3, 37, 50)).to(dtype).requires_grad_()
    grad = torch.randn(3, 37, 50).to(dtype)
    eager = gelu(x)
    (eager_grad,) = torch.autograd.grad(eager, x, grad)
    compiled = torch.compile(gelu, backend="aot_eager")(x)
    (compiled_grad,) = torch.autograd.grad(compiled, x, grad)
    torch.testing.assert_close(eager, torch.nn.functional.gelu(x, approximate="tanh"), rtol=0,
                               atol=0)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(compiled, eager, rtol=tol, atol=tol)
    torch.testing.assert_close(compiled_grad, eager_grad, rtol=tol, atol=tol)


def _count_flops(fn) -> float:
    """FLOPs of ``fn()`` by torch's FlopCounterMode, with the CPU flash-attention op (which
    torch has no formula for) counted as 4 * B * H * L * S * D."""
    from torch.utils.flop_counter import FlopCounterMode

    def cpu_flash(q_shape, k_shape, *args, out_shape=None, **kwargs) -> int:
        b, h, length, d = q_shape
        return 4 * b * h * length * k_shape[2] * d

    mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash}
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter, torch.no_grad():
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("prediction", ["velocity", "warp"])
def test_flop_formulas_equal_torchs_flop_counter(prediction):
    cfg = ModelConfig(resolution=16, channels=3, clip_frames=2, patch=4, dim=24, depth=2,
                      heads=2, reference_frame=prediction == "warp", prediction=prediction)
    model = TinyWorldDiT(cfg)
    frames = torch.randn(1, 5, 3, 16, 16)
    actions = torch.randint(0, 5, (1, 5))
    cache = model.extend_cache(model.empty_cache(), frames, actions, sigma=0.014)
    x = torch.randn(3, 2, 3, 16, 16)
    counted = _count_flops(lambda: model.velocity(x, torch.rand(3), actions[0, :2], cache))
    assert model.velocity_flops(3, cache.num_tokens) == counted
    # chunk by chunk, each chunk attends to exactly its own and the earlier chunks
    counted = _count_flops(lambda: model.extend_cache(model.empty_cache(), frames, actions,
                                                      sigma=0.014))
    assert model.history_flops(5) == counted


def test_key_embedding_is_compositional():
    """A key combination is conditioned by the sum of its keys' vectors (and the prompt frame
    by its own), so combinations rare in pretraining are still expressible."""
    model = _model()
    forward, yaw_right = torch.tensor([[9]]), torch.tensor([[1]])
    both = action_id(torch.tensor([[1]]), torch.tensor([[1]]))
    sigma = torch.zeros(1, dtype=torch.float64)

    def embed(a):
        return model._conditioning(sigma, a) - model._conditioning(sigma, torch.tensor([[0]]))

    assert torch.allclose(embed(both), embed(forward) + embed(yaw_right))
    assert model.keys_of_action[PROMPT_ACTION].tolist() == [0.0] * 8 + [1.0]
    assert model.keys_of_action[0].sum() == 0


def test_motion_latents_condition_the_clip_and_match_between_paths():
    """A motion_latent model: the latents change the prediction, the teacher-forced and the
    cached paths agree with them, and missing or unexpected latents are clear errors."""
    cfg = dataclasses.replace(CFG, prediction="warp", reference_frame=True, motion_latent=True)
    model = _model(cfg)
    frames, _ = _history(2)
    g = torch.Generator().manual_seed(5)
    actions = torch.randint(0, 81, (1, 4), generator=g)
    x_t = torch.randn(1, 4, 3, 16, 16, generator=g, dtype=torch.float64)
    sigma = torch.rand(1, 2, generator=g, dtype=torch.float64)
    motion = torch.randn(1, 2, 3, generator=g, dtype=torch.float64)
    with torch.no_grad():
        tf = model.teacher_forced_velocity(frames, actions, x_t, sigma, context_sigma=0.02,
                                           motion=motion)
        hist = torch.cat([torch.zeros(1, 1, dtype=torch.long), actions], dim=1)
        for j in range(2):
            cache = model.extend_cache(model.empty_cache(), frames[:, :1 + 2 * j],
                                       hist[:, :1 + 2 * j], sigma=0.02)
            clip = slice(2 * j, 2 * j + 2)
            want = model.velocity(x_t[:, clip], sigma[:, j], actions[:, clip], cache,
                                  motion=motion[:, j])
            torch.testing.assert_close(tf[:, clip], want, rtol=1e-9, atol=1e-9)
            other = model.velocity(x_t[:, clip], sigma[:, j], actions[:, clip], cache,
                                   motion=motion[:, j] + 1.0)
            assert not torch.allclose(other, want)
        with pytest.raises(ValueError, match=r"motion latents of shape \[1, 3\]"):
            model.velocity(x_t[:, :2], sigma[:, 0], actions[:, :2], cache)
        with pytest.raises(ValueError, match="without model.motion_latent"):
            _model().velocity(x_t[:, :2], sigma[:, 0], actions[:, :2],
                              _model().empty_cache(), motion=motion[:, 0])
