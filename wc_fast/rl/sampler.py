"""Flow-matching sampler for G candidate clips sharing one history (docs/design.md sections
3, 4 and 9).

The deterministic Euler ODE ``x <- x + (s_{i+1} - s_i) v`` over :func:`sigma_schedule` starts
each candidate from its own initial noise (``candidate_noise="independent"``, WorldCompass).
The ``sde`` variant starts every candidate from ONE shared noise and injects fresh noise at
each step (the DanceGRPO / Flow-GRPO sampling that WorldCompass ablates against). The last
step to ``s = 0`` is always the deterministic ``x - s v``, i.e. the x0 prediction.
:meth:`ClipSampler.sample_sde` is Flow-GRPO's sampling for its update: per-candidate (or, as in
DanceGRPO, shared) initial noise, SDE steps at every step but the last or in a window of them,
and every stochastic step recorded with its log-probability. With ``noise_warp > 0`` every
drawn initial noise is noise-warped along the commanded camera motion
(:func:`wc_fast.rl.noise_warp.warp_noise`) before sampling starts.

Execution: ``eager`` (the reference), ``compile`` (``torch.compile`` of one step;
``reduce-overhead`` on CUDA) or ``cuda_graph`` (the whole step loop captured once per shape
with static buffers and replayed). ``auto`` picks ``cuda_graph`` on CUDA and ``eager`` on CPU.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

import torch
from torch import Tensor

from wc_fast.config import CandidateNoise, Capture
from wc_fast.models.motion_latent import noise_latents
from wc_fast.models.protocol import ContextCache, WorldModel
from wc_fast.rl.noise_warp import warp_noise
from wc_kernels import sde_log_prob

if typing.TYPE_CHECKING:
    from wc_fast.models.tiny.dit import WarpParts

CAPTURE_MODES = typing.get_args(Capture)
CANDIDATE_NOISE_MODES = typing.get_args(CandidateNoise)
# per-candidate keyword inputs of a model's velocity, by name (see ClipSampler.sample)
Offsets = dict[str, Tensor]


def sigma_schedule(steps: int = 40, shift: float = 5.0) -> Tensor:
    """``steps + 1`` sigmas from 1 to 0: ``s' = shift*s / (1 + (shift-1)*s)``, s = linspace(1, 0).

    Equals diffusers' ``FlowMatchEulerDiscreteScheduler(shift=shift)`` after
    ``set_timesteps(sigmas=linspace(1, 0, steps + 1)[:-1])``. Computed in float64, returned fp32.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if not shift > 0:
        raise ValueError(f"shift must be > 0, got {shift!r}")
    s = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return time_shift(s, shift).to(torch.float32)


def time_shift(s: Tensor, shift: float) -> Tensor:
    """``shift * s / (1 + (shift - 1) * s)``: moves sigmas in (0, 1) toward 1 for ``shift > 1``.
    The sampler's schedule and pretraining's training sigmas both pass through it."""
    return shift * s / (1.0 + (shift - 1.0) * s)


def sde_step_std(sigma: float, noise_level: float, sigma_max: float) -> float:
    """Flow-GRPO's per-step noise std ``a * sqrt(s / (1 - s))`` (``s = 1`` uses ``sigma_max``)."""
    s_safe = sigma_max if sigma >= 1.0 else sigma
    return noise_level * (sigma / (1.0 - s_safe)) ** 0.5


@dataclass(slots=True)
class SDETrajectory:
    """The ``K`` stochastic steps of one sampling loop of ``G`` candidates.

    Step ``k`` is schedule step ``index[k]``: it moved every candidate from ``sample[k]`` to
    ``prev_sample[k]`` (both ``[K, G, F, C, H, W]``), from noise level ``sigma[k]`` to
    ``sigma_next[k]`` (``[K]``); ``log_prob[k]`` ``[G]`` is the sampling model's
    log-probability of each move (:func:`wc_kernels.sde_log_prob`), what GRPO's ratio divides by.
    """

    index: list[int]
    sample: Tensor
    prev_sample: Tensor
    sigma: Tensor
    sigma_next: Tensor
    log_prob: Tensor


@dataclass(slots=True)
class SampledClips:
    """Sampled clips ``[G, F, C, H, W]`` and everything needed to replay them exactly
    (``trajectory``: the recorded SDE steps of :meth:`ClipSampler.sample_sde`)."""

    clips: Tensor
    noise: Tensor
    step_noise: Tensor | None = None
    trajectory: SDETrajectory | None = None


class ClipSampler:
    """Samples ``G`` candidates of the next clip for one shared :class:`ContextCache`."""

    def __init__(self, model: WorldModel, *, steps: int = 40, shift: float = 5.0,
                 capture: str = "auto", candidate_noise: str = "independent",
                 sde_noise: float = 0.7, noise_warp: float = 0.0,
                 candidate_chunk: int = 0) -> None:
        if capture not in CAPTURE_MODES:
            raise ValueError(f"capture must be one of {CAPTURE_MODES}, got {capture!r}")
        if candidate_noise not in CANDIDATE_NOISE_MODES:
            raise ValueError(f"candidate_noise must be one of {CANDIDATE_NOISE_MODES}, got "
                             f"{candidate_noise!r}")
        if not 0.0 <= sde_noise <= 1.0:
            raise ValueError(f"sde_noise must lie in [0, 1], got {sde_noise!r}")
        if not 0.0 <= noise_warp <= 1.0:
            raise ValueError(f"noise_warp must lie in [0, 1], got {noise_warp!r}")
        if isinstance(candidate_chunk, bool) or not isinstance(candidate_chunk, int) \
                or candidate_chunk < 0:
            raise ValueError(f"candidate_chunk must be an int >= 0, got {candidate_chunk!r}")
        self.model = model
        self.sigmas = sigma_schedule(steps, shift).tolist()
        self.capture = capture
        self.candidate_noise = candidate_noise
        self.sde_noise = sde_noise
        self.noise_warp = noise_warp
        self.candidate_chunk = candidate_chunk
        self._compiled_step = None
        self._graphs: dict[tuple, _CapturedLoop] = {}

    # -- public -------------------------------------------------------------------------------

    def sample(self, cache: ContextCache, actions: Tensor, *, num: int,
               generator: torch.Generator | None = None, noise: Tensor | None = None,
               step_noise: Tensor | None = None, offsets: Offsets | None = None
               ) -> SampledClips:
        """``num`` candidates of one clip; ``actions`` ``[F]`` (shared) or ``[num, F]``.

        Initial ``noise`` ``[num, F, C, H, W]`` (and, for ``sde``, ``step_noise``
        ``[T-1, num, F, C, H, W]``) are drawn from ``generator`` unless given, and returned so
        the rollout can be replayed; drawn noise is warped by the actions (``noise_warp``),
        given noise is used as it is. ``offsets``: per-candidate inputs ``[num, ...]`` passed to
        the model's ``velocity`` by keyword (``action_offset``: a soft change of each
        candidate's pressed keys; ``affine_offset``: a camera motion imposed by the embedded
        model's warp head), with which rollouts explore camera motion. With
        ``candidate_chunk`` the candidates are integrated that many at a time, from the noise
        drawn for all ``num``.
        """
        device = self._device()
        shape = self._clip_shape(num)
        if noise is None:
            noise = self.initial_noise(actions, num=num, generator=generator)
        elif tuple(noise.shape) != shape:
            raise ValueError(f"noise must have shape {shape}, got {tuple(noise.shape)}")
        if self.candidate_noise == "sde" and step_noise is None:
            step_noise = torch.randn((len(self.sigmas) - 2, *shape), generator=generator,
                                     device=device)
        actions = actions.to(device)
        with torch.no_grad():
            parts = [self._integrate(noise[rows], cache,
                                     actions[rows] if actions.dim() == 2 else actions,
                                     None if step_noise is None else step_noise[:, rows],
                                     {k: t[rows] for k, t in (offsets or {}).items()} or None)
                     for rows in self._chunks(num)]
        clips = parts[0] if len(parts) == 1 else torch.cat(parts)
        return SampledClips(clips=clips, noise=noise, step_noise=step_noise)

    def initial_noise(self, actions: Tensor, *, num: int,
                      generator: torch.Generator | None = None) -> Tensor:
        """The initial noise ``[num, F, C, H, W]`` :meth:`sample` draws from ``generator`` when
        given none: one per candidate (or one shared, ``candidate_noise="sde"``), warped by the
        ``actions`` with ``noise_warp``."""
        shape = self._clip_shape(num)
        drawn = shape if self.candidate_noise == "independent" else (1, *shape[1:])
        noise = torch.randn(drawn, generator=generator, device=self._device()
                            ).expand(shape).contiguous()
        return self._warped(noise, actions)

    def final_parts(self, cache: ContextCache, actions: Tensor, noise: Tensor, *,
                    step_noise: Tensor | None = None, offsets: Offsets | None = None
                    ) -> WarpParts:
        """The warp head's flow, warped reference and residual at the last step of the
        sampling :meth:`sample` runs from ``noise`` (``step_noise``, ``offsets`` as there;
        eager): that step goes to sigma 0, where the Euler update ``x - s v`` of an
        x0-predicting head returns the head's clip, so the sampled clip is
        ``warped + residual`` (before the model bounds it; exactly so while the last step's
        sigma is at least the head's smallest divisor, ``X0_MIN_SIGMA`` of
        :mod:`wc_fast.models.tiny.dit`). Only for a model with a warp head
        (``warp_parts``, :class:`~wc_fast.models.tiny.dit.TinyWorldDiT` with
        ``prediction="warp"``)."""
        parts = getattr(self.model, "warp_parts", None)
        if parts is None:
            raise TypeError(f"final_parts needs a model with a warp head (warp_parts), got "
                            f"{type(self.model).__name__}")
        if tuple(noise.shape) != self._clip_shape(noise.shape[0]):
            raise ValueError(f"noise must have shape {self._clip_shape(noise.shape[0])}, got "
                             f"{tuple(noise.shape)}")
        num, device = noise.shape[0], noise.device
        extra = {"motion": noise_latents(noise)} if self.model.motion_latent else {}
        extra.update(offsets or {})
        last = len(self.sigmas) - 2
        with torch.no_grad():
            x = self._loop(self._step, noise, cache, actions.to(device), step_noise, offsets,
                           stop=last)
            return parts(x, torch.full((num,), self.sigmas[last], device=device),
                         actions.to(device), cache, **extra)

    def sample_sde(self, cache: ContextCache, actions: Tensor, *, num: int,
                   generator: torch.Generator | None = None, same_noise: bool = False,
                   window: int = 0, offsets: Offsets | None = None) -> SampledClips:
        """``num`` candidates of one clip sampled with Flow-GRPO's SDE, each stochastic step
        recorded in the result's ``trajectory``; ``actions`` ``[F]`` or ``[num, F]``.

        Each candidate starts from its own initial noise, or all from one (``same_noise``,
        DanceGRPO), warped by the actions with ``noise_warp``. Noise of level ``sde_noise``
        enters at every step but the last (``window = 0``) or at ``window`` consecutive steps
        placed at random (Flow-GRPO-Fast), with deterministic Euler steps elsewhere. Runs
        eagerly: the trajectory needs each step's velocity. Every draw comes from
        ``generator``. ``offsets`` as in :meth:`sample` (the recorded log-probabilities are
        then those of the offset policy).
        """
        device = self._device()
        shape = self._clip_shape(num)
        noise = torch.randn(shape if not same_noise else (1, *shape[1:]), generator=generator,
                            device=device).expand(shape).contiguous()
        noise = self._warped(noise, actions)
        stochastic = self._sde_steps(window, generator, device)
        with torch.no_grad():
            clips, trajectory = self._record(noise, cache, actions.to(device), stochastic,
                                             generator, offsets)
        return SampledClips(clips=clips, noise=noise, trajectory=trajectory)

    # -- internals ----------------------------------------------------------------------------

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _chunks(self, num: int) -> list[slice]:
        """The candidates ``0..num-1`` in runs of ``candidate_chunk`` (one run without)."""
        size = self.candidate_chunk or num
        return [slice(i, min(i + size, num)) for i in range(0, num, size)]

    def _clip_shape(self, num: int) -> tuple[int, ...]:
        return (num, *self.model.clip_shape)

    def _warped(self, noise: Tensor, actions: Tensor) -> Tensor:
        """Drawn initial noise ``[G, F, C, H, W]``, noise-warped by the per-frame ``actions``
        ``[F]`` or ``[G, F]`` when ``noise_warp > 0`` (else returned as it is)."""
        if self.noise_warp == 0.0:
            return noise
        return warp_noise(noise, actions.to(noise.device), self.noise_warp)

    def _mode(self, device: torch.device) -> str:
        if self.capture == "auto":
            return "cuda_graph" if device.type == "cuda" else "eager"
        if self.capture == "cuda_graph" and device.type != "cuda":
            raise RuntimeError("capture='cuda_graph' needs the model on a CUDA device")
        return self.capture

    def _integrate(self, noise: Tensor, cache: ContextCache, actions: Tensor,
                   step_noise: Tensor | None, offsets: Offsets | None = None) -> Tensor:
        mode = self._mode(noise.device)
        if mode == "cuda_graph":
            key = (tuple(noise.shape), cache.num_tokens, cache.num_frames, tuple(actions.shape),
                   noise.dtype, step_noise is not None, tuple(sorted(offsets or {})))
            if key not in self._graphs:
                self._graphs[key] = _CapturedLoop(self, noise, cache, actions, step_noise,
                                                  offsets)
            return self._graphs[key].replay(noise, cache, actions, step_noise, offsets)
        if mode != "compile":
            return self._loop(self._step, noise, cache, actions, step_noise, offsets)
        if noise.device.type != "cuda":
            return self._loop(self._compiled(noise.device), noise, cache, actions, step_noise,
                              offsets)
        # reduce-overhead replays CUDA graphs whose outputs live in memory the next replay
        # reuses: one generation per sampling loop (each step's output feeds the next step
        # inside it), and the result copied out before a later loop overwrites it
        torch.compiler.cudagraph_mark_step_begin()
        return self._loop(self._compiled(noise.device), noise, cache, actions,
                          step_noise, offsets).clone()

    def _sde_steps(self, window: int, generator: torch.Generator | None,
                   device: torch.device) -> list[int]:
        """Indices of the stochastic steps: all but the last for ``window = 0``, else
        ``window`` consecutive ones starting at a random step (never the last)."""
        last = len(self.sigmas) - 2  # the final step, to sigma 0, stays deterministic
        if not 0 <= window <= last:
            raise ValueError(f"window must lie in [0, {last}] for {last + 1} steps, got "
                             f"{window!r}")
        if window == 0:
            return list(range(last))
        start = int(torch.randint(last - window + 1, (1,), generator=generator, device=device))
        return list(range(start, start + window))

    def _record(self, noise: Tensor, cache: ContextCache, actions: Tensor,
                stochastic: list[int], generator: torch.Generator | None,
                offsets: Offsets | None = None) -> tuple[Tensor, SDETrajectory]:
        """Integrate ``noise`` ``[G, F, C, H, W]`` with SDE steps at ``stochastic`` and Euler
        steps elsewhere; return the clips and the recorded SDE steps."""
        x = noise.clone()
        num, device = noise.shape[0], noise.device
        extra = {"motion": noise_latents(noise)} if self.model.motion_latent else {}
        extra.update(offsets or {})
        sigma_max = self.sigmas[1]
        steps: list[tuple[int, Tensor, Tensor, Tensor]] = []
        for i, (s, s_next) in enumerate(zip(self.sigmas[:-1], self.sigmas[1:], strict=True)):
            sigma = torch.full((num,), s, device=device)
            s_t, dt = torch.full((), s, device=device), torch.full((), s_next - s, device=device)
            v = self.model.velocity(x, sigma, actions, cache, **extra)
            if i not in stochastic:
                x = self._update(x, v, s_t, dt, None, None)
                continue
            std = torch.full((), sde_step_std(s, self.sde_noise, sigma_max), device=device)
            eps = torch.randn(x.shape, generator=generator, device=device)
            x_next = self._update(x, v, s_t, dt, std, eps)
            log_prob = sde_log_prob(v, x, x_next, sigma, torch.full((num,), s_next, device=device),
                                    noise_level=self.sde_noise, sigma_max=sigma_max)
            steps.append((i, x, x_next, log_prob))
            x = x_next
        index = [i for i, *_ in steps]
        trajectory = SDETrajectory(
            index=index, sample=torch.stack([t[1] for t in steps]),
            prev_sample=torch.stack([t[2] for t in steps]),
            sigma=torch.tensor([self.sigmas[i] for i in index], device=device),
            sigma_next=torch.tensor([self.sigmas[i + 1] for i in index], device=device),
            log_prob=torch.stack([t[3] for t in steps]))
        return x, trajectory

    def _compiled(self, device: torch.device):
        """``torch.compile`` of one step; on CUDA with ``reduce-overhead`` (its own graphs)."""
        if self._compiled_step is None:
            mode = "reduce-overhead" if device.type == "cuda" else None
            self._compiled_step = torch.compile(self._step, mode=mode, dynamic=False)
        return self._compiled_step

    def _loop(self, step, noise: Tensor, cache: ContextCache, actions: Tensor,
              step_noise: Tensor | None, offsets: Offsets | None = None,
              stop: int | None = None) -> Tensor:
        """Integrate from ``noise`` over the schedule (its first ``stop`` steps when given);
        per-step scalars are device tensors."""
        x = noise.clone()
        num, device = noise.shape[0], noise.device
        # a model with motion latents reads them from each candidate's initial noise
        motion = noise_latents(noise) if self.model.motion_latent else None
        pairs = list(zip(self.sigmas[:-1], self.sigmas[1:], strict=True))[:stop]
        for i, (s, s_next) in enumerate(pairs):
            stochastic = step_noise is not None and s_next > 0
            std = sde_step_std(s, self.sde_noise, self.sigmas[1]) if stochastic else 0.0
            x = step(x, torch.full((num,), s, device=device), torch.full((), s, device=device),
                     torch.full((), s_next - s, device=device), torch.full((), std, device=device),
                     actions, cache.keys, cache.values, cache.num_frames, cache.signature,
                     cache.last_frame, step_noise[i] if stochastic else None, motion, offsets)
        return x

    def _step(self, x: Tensor, sigma: Tensor, s: Tensor, dt: Tensor, std: Tensor,
              actions: Tensor, keys: list[Tensor], values: list[Tensor], num_frames: int,
              signature: tuple, last_frame: Tensor | None, eps: Tensor | None,
              motion: Tensor | None = None, offsets: Offsets | None = None) -> Tensor:
        """One Euler step, or a Flow-GRPO SDE step when ``eps`` is given, from ``s`` by ``dt``."""
        cache = ContextCache(keys=keys, values=values, num_frames=num_frames,
                             signature=signature, last_frame=last_frame)
        extra = {} if motion is None else {"motion": motion}
        extra.update(offsets or {})
        v = self.model.velocity(x, sigma, actions, cache, **extra)
        return self._update(x, v, s, dt, std, eps)

    @staticmethod
    def _update(x: Tensor, v: Tensor, s: Tensor, dt: Tensor, std: Tensor | None,
                eps: Tensor | None) -> Tensor:
        """``x`` ``[G, F, C, H, W]`` moved by velocity ``v`` from ``s`` by ``dt``: Euler without
        ``eps``, else Flow-GRPO's SDE step of noise std ``std`` (the mean
        :func:`wc_kernels.sde_log_prob` scores)."""
        if eps is None:
            return x + dt * v
        drift = x * (1 + std**2 / (2 * s) * dt) + v * (1 + std**2 * (1 - s) / (2 * s)) * dt
        return drift + std * (-dt).sqrt() * eps


class _CapturedLoop:
    """The whole sampling loop captured in one CUDA graph for one input shape.

    Inputs (noise, history keys/values, actions, step noise, per-candidate offsets) live in static
    buffers refreshed with ``copy_``; the schedule is baked into the captured steps; there is no
    host sync.
    """

    def __init__(self, sampler: ClipSampler, noise: Tensor, cache: ContextCache,
                 actions: Tensor, step_noise: Tensor | None, offsets: Offsets | None) -> None:
        self.noise = noise.clone()
        self.keys = [k.clone() for k in cache.keys]
        self.values = [v.clone() for v in cache.values]
        self.last_frame = None if cache.last_frame is None else cache.last_frame.clone()
        self.actions = actions.clone()
        self.step_noise = None if step_noise is None else step_noise.clone()
        self.offsets = {name: t.clone() for name, t in (offsets or {}).items()}
        self.cache = ContextCache(self.keys, self.values, cache.num_frames, cache.signature,
                                  self.last_frame)
        run = lambda: sampler._loop(sampler._step, self.noise, self.cache,  # noqa: E731
                                    self.actions, self.step_noise, self.offsets)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):
                run()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.out = run()

    def replay(self, noise: Tensor, cache: ContextCache, actions: Tensor,
               step_noise: Tensor | None, offsets: Offsets | None) -> Tensor:
        self.noise.copy_(noise)
        for dst, src in zip(self.keys + self.values, cache.keys + cache.values, strict=True):
            dst.copy_(src)
        if self.last_frame is not None:
            self.last_frame.copy_(cache.last_frame)
        self.actions.copy_(actions)
        if step_noise is not None:
            self.step_noise.copy_(step_noise)
        for name, t in (offsets or {}).items():
            self.offsets[name].copy_(t)
        self.graph.replay()
        return self.out.clone()
