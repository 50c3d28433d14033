"""World-R1's two trainer options (docs/design.md section 4.2): periodic decoupled training on
VQ alone over high-motion prompts, and noise-warped initial noise; each resumes exactly and
gives a 1-process run's weights on 2 gloo ranks."""

import json
import shutil

import pytest
import torch
from gloo_ranks import spawn_ranks
from test_train import SMOKE, _assert_same, _final_weights, _rank
from test_trainer_options import _config

from wc_fast.actions import action_id, num_primitives
from wc_fast.infra import checkpoint
from wc_fast.models import TinyWorldDiT
from wc_fast.models.motion_latent import noise_latents
from wc_fast.rl import sampler as sampler_module
from wc_fast.rl.advantages import optimality
from wc_fast.rl.noise_warp import warp_noise
from wc_fast.rl.sampler import ClipSampler
from wc_fast.rl.trainer import Trainer, decoupled, group_prompt, high_motion_prompt
from wc_fast.train import main

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
YAW_RIGHT = int(action_id(torch.tensor(0), torch.tensor(1)))
PITCH_UP = int(action_id(torch.tensor(0), torch.tensor(3)))
FORWARD = int(action_id(torch.tensor(1), torch.tensor(0)))
FORWARD_YAW_RIGHT = int(action_id(torch.tensor(1), torch.tensor(1)))


# -- periodic decoupled training ----------------------------------------------------------------

@pytest.mark.parametrize("every,length,want", [(4, 1, [3, 7, 11]), (5, 2, [3, 4, 8, 9]),
                                               (2, 1, [1, 3, 5, 7, 9, 11]), (0, 1, [])])
def test_decoupled_iterations_are_the_last_of_every_period(every, length, want):
    cfg = _config(reward__decouple_every=str(every), reward__decouple_length=str(length))
    assert [k for k in range(12) if decoupled(cfg.reward, k)] == want


def _one_update(monkeypatch, step: int, s_if: torch.Tensor, s_vq: torch.Tensor
                ) -> tuple[dict, torch.Tensor, bool]:
    """Iteration ``step`` of a fresh smoke trainer (the last of every 2 iterations decoupled)
    whose rewards are the scores ``[1, G]``: the weights after it, the advantages ``[1, G]``
    it trained on and whether it was decoupled."""
    monkeypatch.setattr(Trainer, "_scores",
                        lambda self, groups: (s_if, s_vq, [0.0] * len(groups)))
    cfg = _config(reward__decouple_every="2")
    torch.manual_seed(cfg.train.seed)
    trainer = Trainer(cfg, TinyWorldDiT(cfg.model), CPU)
    seen = []
    real = trainer.update

    def update(step, groups, r, adv):
        seen.append(adv)
        return real(step, groups, r, adv)

    monkeypatch.setattr(trainer, "update", update)
    stats = trainer.iteration(step)
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    return weights, seen[0], stats.decoupled


def _differ(a: dict, b: dict) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


def test_a_decoupled_update_follows_vq_alone(monkeypatch):
    """In a decoupled iteration other IF scores leave the update bit for bit as it was and
    other VQ scores change it; outside the phase the configured reward (IF and VQ) is used."""
    s_if = torch.arange(6, dtype=torch.float32)[None]
    s_vq = torch.tensor([[3.0, 0.0, 5.0, 1.0, 4.0, 2.0]])
    other_if, other_vq = s_if.flip(1), s_vq.roll(1, dims=1)
    rw = _config().reward
    _, vq_alone = optimality(s_if, s_vq, lam=0.0, Z=rw.Z, std=rw.std)
    _, both = optimality(s_if, s_vq, lam=rw.lam, Z=rw.Z, std=rw.std)

    base, adv, is_decoupled = _one_update(monkeypatch, 1, s_if, s_vq)
    assert is_decoupled
    torch.testing.assert_close(adv, vq_alone, rtol=0, atol=0)
    assert not _differ(base, _one_update(monkeypatch, 1, other_if, s_vq)[0])
    assert _differ(base, _one_update(monkeypatch, 1, s_if, other_vq)[0])

    base, adv, is_decoupled = _one_update(monkeypatch, 0, s_if, s_vq)
    assert not is_decoupled
    torch.testing.assert_close(adv, both, rtol=0, atol=0)
    assert _differ(base, _one_update(monkeypatch, 0, other_if, s_vq)[0])


def _presses(actions: torch.Tensor) -> int:
    """The fewest keys any frame of action ids ``[...]`` presses."""
    return int(num_primitives(actions).min())


@pytest.mark.parametrize("min_keys,composite_keys", [("1", "2,3,4"), ("2", "2"),
                                                     ("3", "2,3")])
def test_decoupled_prompts_press_the_minimum_keys_in_every_clip(min_keys, composite_keys):
    """Every phase prompt presses ``decouple_min_keys`` keys or more on every frame (never more
    keys than the rollout's combinations have), while ordinary prompts include single keys; a
    prompt depends only on (seed, step, group)."""
    cfg = _config(reward__decouple_every="4", reward__decouple_min_keys=min_keys,
                  rollout__composite_keys=composite_keys)
    need, most = int(min_keys), max(cfg.rollout.composite_keys)
    prompts = [high_motion_prompt(cfg, step, group, CPU) for step in (3, 7) for group in range(4)]
    for frame, actions in prompts:
        assert frame.shape == (1, 1, 3, cfg.model.resolution, cfg.model.resolution)
        assert actions.shape == (cfg.rollout.num_clips * cfg.model.clip_frames,)
        assert need <= _presses(actions) and int(num_primitives(actions).max()) <= most
    assert len({tuple(a.tolist()) for _, a in prompts}) > 1
    frame, actions = high_motion_prompt(cfg, 3, 1, CPU)
    assert torch.equal(actions, prompts[1][1]) and torch.equal(frame, prompts[1][0])
    ordinary = [group_prompt(cfg, 3, group, CPU)[1] for group in range(8)]
    assert min(_presses(a) for a in ordinary) <= 1


def test_a_decoupled_iteration_rolls_out_the_high_motion_prompt(monkeypatch):
    monkeypatch.setattr(Trainer, "_scores", lambda self, groups: (
        torch.rand(1, 6), torch.rand(1, 6), [0.0]))
    cfg = _config(reward__decouple_every="4", reward__decouple_length="2")
    trainer = Trainer(cfg, TinyWorldDiT(cfg.model), CPU)
    for step in (1, 2):  # clip 2, so the history's actions are rolled out too
        (group,) = trainer.rollout(step, 2)
        prompt, actions = (high_motion_prompt if step == 2 else group_prompt)(cfg, step, 0, CPU)
        torch.testing.assert_close(group.history[:, :1], prompt, rtol=0, atol=0)
        f = cfg.model.clip_frames
        assert torch.equal(group.history_actions[0, 1:], actions[:f])
        assert torch.equal(group.clip_actions, actions[f:2 * f])


# -- noise-warped initial noise -----------------------------------------------------------------

def _draws(num: int, seed: int = 0) -> torch.Tensor:
    """``num`` independent standard-normal clip noises ``[num, 4, 3, 32, 32]``."""
    return torch.randn(num, 4, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("strength", [0.5, 0.9, 1.0])
def test_warped_noise_stays_standard_normal(strength):
    """Mean 0 and variance 1 over many draws, per frame, per element on average, and in every
    row and column (pixels that see the previous frame and pixels that came into view alike),
    for rotation, translation (zoom) and combined commands, one command per candidate."""
    noise = _draws(2000)
    commands = torch.tensor([YAW_RIGHT, PITCH_UP, FORWARD, FORWARD_YAW_RIGHT])
    actions = commands.repeat(500)[:, None].expand(-1, 4)
    out = warp_noise(noise, actions, strength)
    for command in commands:
        part = out[actions[:, 0] == command]  # [500, F, C, H, W]
        assert abs(float(part.mean())) < 0.01
        per_frame_std = part.transpose(0, 1).flatten(1).std(dim=1)
        torch.testing.assert_close(per_frame_std, torch.ones(4), rtol=0, atol=0.01)
        assert abs(float(part.var(dim=0).mean()) - 1.0) < 0.01
        moved = part[:, 1:]  # 144k values per row or column: a standard error of 0.004
        for dims in ((0, 1, 2, 3), (0, 1, 2, 4)):
            torch.testing.assert_close(moved.var(dim=dims), torch.ones(32), rtol=0, atol=0.03)


def test_warping_leaves_frame_one_and_the_motion_latents_untouched():
    noise = _draws(8)
    out = warp_noise(noise, torch.full((4,), FORWARD_YAW_RIGHT), 0.9)
    assert torch.equal(out[:, 0], noise[:, 0])
    assert torch.equal(noise_latents(out), noise_latents(noise))
    assert not torch.equal(out[:, 1:], noise[:, 1:])


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_a_yaw_command_moves_the_noise_left():
    """Turning right moves the image left by ``f tan(4.8 deg)``, about 2 pixels at 32x32:
    each warped frame's centre matches the previous frame's centre 2 pixels to the right, with
    correlation ``a``; unwarped noise, or the opposite shift, gives none."""
    noise = _draws(200)
    actions = torch.full((4,), YAW_RIGHT)

    def shifted(x: torch.Tensor, shift: int) -> float:
        return _correlation(x[:, 1:, :, 8:24, 8:24], x[:, :-1, :, 8:24, 8 + shift:24 + shift])

    warped = warp_noise(noise, actions, 0.9)
    assert shifted(warped, 2) > 0.85
    assert abs(shifted(warped, -2)) < 0.02 and abs(shifted(noise, 2)) < 0.02


def _sampler(noise_warp: float) -> tuple[ClipSampler, object]:
    """A smoke model's sampler with this warp strength, and an empty history cache."""
    cfg = _config()
    torch.manual_seed(0)
    model = TinyWorldDiT(cfg.model).eval()
    sampler = ClipSampler(model, steps=cfg.rollout.steps, noise_warp=noise_warp)
    prompt = torch.zeros(1, 1, *model.clip_shape[1:])
    return sampler, model.extend_cache(model.empty_cache(), prompt,
                                       torch.zeros(1, 1, dtype=torch.long), sigma=0.0)


@pytest.mark.parametrize("method", ["sample", "sample_sde"])
def test_the_sampler_warps_drawn_noise_after_frame_one(method):
    actions = torch.full((4,), YAW_RIGHT)
    runs = {}
    for strength in (0.0, 0.8):
        sampler, cache = _sampler(strength)
        draw = getattr(sampler, method)
        runs[strength] = draw(cache, actions, num=3, generator=torch.Generator().manual_seed(5))
    plain, warped = runs[0.0].noise, runs[0.8].noise
    torch.testing.assert_close(plain, _draws(3, 5), rtol=0, atol=0)  # today's draw
    torch.testing.assert_close(warped, warp_noise(plain, actions, 0.8), rtol=0, atol=0)
    assert torch.equal(noise_latents(warped), noise_latents(plain))
    assert not torch.equal(runs[0.0].clips, runs[0.8].clips)


def test_noise_warp_off_never_warps(monkeypatch):
    calls = []
    monkeypatch.setattr(sampler_module, "warp_noise", lambda *a: calls.append(a))
    sampler, cache = _sampler(0.0)
    sampler.sample(cache, torch.full((4,), YAW_RIGHT), num=2)
    assert calls == []
    with pytest.raises(ValueError, match="noise_warp"):
        _sampler(1.5)


# -- runs ---------------------------------------------------------------------------------------

DECOUPLE = ["--reward.decouple_every", "3", "--reward.decouple_length", "1"]
WARP = ["--rollout.noise_warp", "0.8", "--model.motion_latent", "true"]


def _rows(out) -> list[dict]:
    return [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def warp_calls(monkeypatch) -> list[float]:
    """The strength of every warp the sampler applies in this process."""
    calls = []
    real = sampler_module.warp_noise

    def spy(noise, actions, strength):
        calls.append(strength)
        return real(noise, actions, strength)

    monkeypatch.setattr(sampler_module, "warp_noise", spy)
    return calls


@pytest.mark.parametrize("option,decoupled_rows", [(DECOUPLE, [0, 0, 1]), (WARP, [0, 0, 0])],
                         ids=["decouple", "noise_warp"])
def test_smoke_run_resumes_exactly(tmp_path, warp_calls, option, decoupled_rows):
    """Three iterations, then the last again from the second checkpoint (the decoupled one
    with ``decouple``), give the same weights; the metrics mark the decoupled iteration."""
    args = [*SMOKE, *option, "--steps", "3", "--out", str(tmp_path), "--train.keep_last", "3"]
    assert main(args) == 0
    assert [row["decoupled"] for row in _rows(tmp_path)] == decoupled_rows
    assert set(warp_calls) == ({0.8} if option is WARP else set())
    uninterrupted = _final_weights(tmp_path)
    shutil.rmtree(checkpoint.latest(tmp_path))
    assert main([*args, "--resume"]) == 0
    _assert_same(uninterrupted, _final_weights(tmp_path))
    assert [row["decoupled"] for row in _rows(tmp_path)] == decoupled_rows


@pytest.mark.parametrize("option,decoupled_rows", [(DECOUPLE, [0, 0, 1]), (WARP, [0, 0, 0])],
                         ids=["decouple", "noise_warp"])
@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process(tmp_path, option, decoupled_rows):
    """Iteration 3 is decoupled with ``decouple``; the 2 ranks draw the same high-motion
    prompts and warped noise for the same global groups as one process."""
    common = [*SMOKE, *option, "--steps", "3", "--reward.std", "global"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*common, "--out", str(one), "--rollout.groups_per_rank", "2"]) == 0
    spawn_ranks(_rank, ([*common, "--out", str(two), "--rollout.groups_per_rank", "1"],),
                tmp_path)
    # the ranks' gradient sum rounds differently from one process's accumulation
    _assert_same(_final_weights(one), _final_weights(two), atol=5e-5)
    for out in (one, two):
        assert [row["decoupled"] for row in _rows(out)] == decoupled_rows
