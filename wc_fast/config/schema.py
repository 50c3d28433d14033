"""The run configuration's schema: slotted dataclasses, one per section, whose fields carry
their documentation (``help`` metadata, which ``--help`` prints) and whose string choices are
``Literal`` types (the one definition of each choice, read by validation and by the modules that
take the same values). The defaults are the paper's column (docs/design.md section 4); the
shipped presets are files (``wc_fast/config/presets``). A field is added with a default that
reproduces the behaviour before it: configs saved without it (a checkpoint's, a study's cache
files) read it at that default and still describe the runs they made."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Literal

from wc_kernels.ops.nft_loss import SPACES

LOGGERS = ("jsonl", "tensorboard", "wandb")  # metric sinks of wc_fast.train

# The choices of every string field: the one definition, read by validate() and by the
# modules that take the same values as arguments (``typing.get_args`` gives the tuple).
Dtype = Literal["float32", "bfloat16", "float16"]
# the world model's network (wc_fast.models.pretrained)
Backbone = Literal["tiny", "wan", "worldplay"]
Prediction = Literal["velocity", "x0", "warp"]  # what the world model's output head predicts
RolloutMode = Literal["clip", "sample"]
CandidateNoise = Literal["independent", "sde"]
Capture = Literal["auto", "eager", "compile", "cuda_graph"]
StdMode = Literal["group", "global"]
RewardKind = Literal["both", "if", "vq"]
IfKind = Literal["label", "soft", "action", "trajectory"]
IfReader = Literal["estimator", "render", "fit", "depth_anything_3", "agreement", "ensemble"]
VqMode = Literal["stride", "drift"]
CriticKind = Literal["reward", "eval", "hpsv3"]
LossSpace = Literal[SPACES]  # the kernels' own choices (a tuple subscript unpacks)
OldPrediction = Literal["old_model", "detached_current"]
ContextKv = Literal["recompute", "recompute_grad", "reuse"]
LatentPairing = Literal["own", "fresh"]
Optimizer = Literal["muon", "adamw"]
Trainable = Literal["all", "conditioning"]
EmaSchedule = Literal["linear", "official", "constant"]
Device = Literal["auto", "cpu", "cuda"]
Distributed = Literal["ddp", "fsdp2"]
Update = Literal["nft", "flow_grpo"]
PREDICTIONS = typing.get_args(Prediction)


@dataclass(slots=True)
class ModelConfig:
    """The world model: its backbone, frame size, clip length and transformer sizes, and how
    its matmuls run. A Wan or WorldPlay backbone read from ``path`` takes its sizes from there.
    """

    resolution: int = field(default=32, metadata={"help": (
        "frame height and width in pixels (the world's and the rewards' frames); a multiple of "
        "model.patch")})
    channels: int = field(default=3, metadata={"help": "colour channels of a frame"})
    clip_frames: int = field(default=4, metadata={"help": (
        "frames per generated clip (with a Wan VAE backbone: latent frames, one per frame)")})
    patch: int = field(default=4, metadata={"help": (
        "pixel patch side of a token (embedded models; a backbone read from model.path has "
        "its own)")})
    dim: int = field(default=192, metadata={"help": (
        "transformer width (embedded models); a multiple of model.heads")})
    depth: int = field(default=6, metadata={"help": "transformer blocks (embedded models)"})
    heads: int = field(default=6, metadata={"help": "attention heads (embedded models)"})
    context_sigma: float = field(default=0.014, metadata={"help": (
        "noise level in [0, 1) the clean history is seen at (that much noise is added to "
        "it)")})
    dtype: Dtype = field(default="float32", metadata={"help": (
        "dtype the model's matmuls and attention run in (torch.autocast; bf16 on a GPU); the "
        "weights, the optimizer state and the loss stay fp32 whatever it is")})
    reference_frame: bool = field(default=True, metadata={"help": (
        "every frame of a chunk also receives, concatenated to its channels, the last frame "
        "before the chunk (image-to-video style conditioning), so reproducing and shifting "
        "the previous view is local work for each token instead of a copy through attention")})
    prediction: Prediction = field(default="velocity", metadata={"help": (
        "what the output head predicts. velocity: the flow velocity directly. x0: the clean "
        "clip, turned into the velocity (x_t - x0) / max(sigma, 0.05), so samplers, losses "
        "and the RL trainer see velocities either way; with large pixel patches (patch dim >= "
        "model dim) the clean frames lie on a low-dimensional manifold the narrow token "
        "stream can carry while the noise does not, so x0 gives sharper frames (Li and He, "
        "'Back to Basics: Let Denoising Generative Models Denoise', 2025). warp: the clean "
        "clip as the reference frame warped (bilinear) by a per-pixel flow plus a global "
        "affine flow per frame, plus a residual, all from the head: camera motion in a static "
        "scene is mostly a warp of the last frame, and a warp keeps its detail sharp where a "
        "narrow token stream would blur it; needs model.reference_frame")})
    motion_latent: bool = field(default=False, metadata={"help": (
        "the model was pretrained with each clip's camera speed, turn rate and onset written "
        "into three directions of its noise (wc_fast.models.motion_latent), so the "
        "candidates of one command move differently (nft.latent_pairing says which latents "
        "the RL update gives it)")})
    pose_branch: bool = field(default=False, metadata={"help": (
        "a camera-pose branch (WorldPlay's): the pressed keys of each frame through one "
        "linear map to that frame's global affine flow, added to the one the head reads from "
        "the tokens (model.prediction warp only). Linear in the keys, so a key combination's "
        "motion is the sum of its keys' motions by construction, where the transformer must "
        "learn to compose them. Zero-initialised: switching it on over weights trained "
        "without it leaves the model unchanged, and RL can then train it")})
    backbone: Backbone = field(default="tiny", metadata={"help": (
        "tiny: the embedded TinyWorldDiT, sized by the fields above. wan: a WanWorldModel; "
        "with an empty model.path the embedded Wan world model (wc_fast.models.wan.embedded), "
        "a tiny diffusers WanTransformer3DModel on the world's pixel frames sized by patch, "
        "dim, depth and heads (no reference frame, velocity prediction); with a model.path it "
        "works on the latents of the Wan VAE. worldplay: a WorldPlayWorldModel "
        "(HY-WorldPlay's transformer) read from model.path")})
    path: str = field(default="", metadata={"help": (
        "a local model directory for model.backbone wan or worldplay (empty: the embedded Wan "
        "model). wan: a diffusers pipeline directory with transformer/ and vae/ subfolders, "
        "both read from there. worldplay: transformer/ in the official layout (its "
        "config.json and the action model's safetensors) and vae/ (diffusers' "
        "HunyuanVideo-1.5 VAE). Such a backbone takes model.resolution (the world's and the "
        "rewards' pixel frames), model.clip_frames (one latent frame per frame, "
        "wc_fast.models.wan.vae) and model.context_sigma from here; its sizes come from the "
        "path, so patch, dim, depth, heads, reference_frame and prediction do not apply")})
    prompt_embeds: str = field(default="", metadata={"help": (
        "a Wan backbone's text conditioning: a .safetensors file holding one tensor "
        "prompt_embeds [1, L, text_dim] (the text encoder's output for the world's prompt, "
        "computed once elsewhere: no text encoder is loaded here); for worldplay it may add "
        "vision_states and byt5_states tensors to its text. Empty: one zero token, a fixed "
        "empty prompt")})
    lora_rank: int = field(default=0, metadata={"help": (
        "rank of LoRA adapters on model.lora_targets of a backbone read from model.path (0 = "
        "off; needs peft, pip install wc_fast[lora]). The backbone's own weights are frozen "
        "and RL trains the adapters and the conditioning parameters (the action layers, the "
        "timestep embedder and every modulation table); checkpoints hold only those, with "
        "model.path and the sha256 of the frozen weights, which a resumed run must match. The "
        "adapters' second factor starts at zero, so the model starts unchanged. LoRA runs on "
        "one process or DDP, not FSDP2")})
    lora_alpha: float = field(default=0.0, metadata={"help": (
        "scales the adapters' product by lora_alpha / lora_rank (0 = the rank: scale 1)")})
    lora_targets: tuple[str, ...] = field(
        default=("to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"),
        metadata={"help": (
            "module names LoRA adapts, as peft matches them (the name or its last dotted "
            "parts); by default every attention projection (to_q, to_k, to_v, to_out.0, self- "
            "and cross-attention) and both FFN linears of every block")})
    activation_checkpointing: bool = field(default=False, metadata={"help": (
        "keep only each transformer block's input in the forwards that build a graph (the "
        "train phase's; never in the no-grad rollouts) and run the block again in the "
        "backward (torch.utils.checkpoint, non-reentrant): activation memory of one block "
        "instead of all, for one more forward per update. Same loss and gradients")})
    history_window: int = field(default=0, metadata={"help": (
        "history frames each chunk attends to: the last this many before it (the cache keeps "
        "only those, so a long rollout's memory stops growing); 0 = the whole history. A model "
        "pretrained on short sequences then sees, clip after clip, the history lengths it was "
        "trained on: the embedded Wan base uses 5, the prompt frame and one clip of its "
        "2-clip pretraining sequences (docs/base_model.md). tiny and wan backbones")})


@dataclass(slots=True)
class RolloutConfig:
    """Candidate generation with the old (EMA) model: groups of candidates per command, the
    sampler, and how the candidates of a group explore."""

    group_size: int = field(default=16, metadata={"help": (
        "candidates per group (one group per command and history)")})
    groups_per_rank: int = field(default=1, metadata={"help": (
        "groups each rank rolls out per iteration (the update's batch)")})
    num_clips: int = field(default=4, metadata={"help": (
        "clips per training sequence: iteration k trains clip (k mod num_clips) + 1, given "
        "the clips before it (progressive schedule)")})
    steps: int = field(default=40, metadata={"help": "sampler steps per clip"})
    shift: float = field(default=5.0, metadata={"help": (
        "time shift of the sampler's sigma schedule (> 0)")})
    mode: RolloutMode = field(default="clip", metadata={"help": (
        "clip: the history is generated once and every candidate generates only the trained "
        "clip (clip-level); sample: every candidate generates its whole sequence "
        "(sample-level)")})
    candidate_noise: CandidateNoise = field(default="independent", metadata={"help": (
        "how the noise makes the candidates of a group differ. independent: each candidate "
        "from its own initial noise with the deterministic ODE sampler (WorldCompass); sde: "
        "one shared initial noise and fresh noise at every step (DanceGRPO / Flow-GRPO), at "
        "rollout.sde_noise")})
    sde_noise: float = field(default=0.7, metadata={"help": (
        "noise level in [0, 1] of the SDE sampler (rollout.candidate_noise sde and train.update "
        "flow_grpo)")})
    composite_fraction: float = field(default=0.5, metadata={"help": (
        "fraction of the training clips that command a key combination, one pressing a "
        "number of keys in rollout.composite_keys")})
    composite_keys: tuple[int, ...] = field(default=(2, 3, 4), metadata={"help": (
        "the numbers of keys a key combination presses (a non-empty subset of 2, 3, 4)")})
    capture: Capture = field(default="auto", metadata={"help": (
        "how the sampler runs: eager (the reference), compile (torch.compile of one step; "
        "reduce-overhead on CUDA), cuda_graph (the whole step loop captured once per shape "
        "and replayed), auto (cuda_graph on CUDA, eager on CPU)")})
    candidate_chunk: int = field(default=0, metadata={"help": (
        "candidates of a group the sampler integrates at once, against the one shared history "
        "cache (0 = the whole group in one batch): a smaller chunk holds fewer candidates' "
        "activations at a time, for more sampler forwards. Every candidate's noise is drawn "
        "for the whole group first, so the candidates do not depend on it. Applies to the ODE "
        "sampling (not train.update flow_grpo's recorded SDE steps)")})
    noise_warp: float = field(default=0.0, metadata={"help": (
        "strength a in [0, 1] of noise-warped initial noise (0 = off; World-R1's camera "
        "conditioning after Go-with-the-Flow, docs/design.md section 4.2). Frames 2..F of "
        "every sampled clip's initial noise are sqrt(1 - a^2) fresh + a warped, where warped "
        "is the previous frame's noise moved along the image flow of the commanded camera "
        "motion (wc_fast.rl.noise_warp); every element stays a standard normal and frame 1 (with "
        "its motion latents) is left as drawn")})
    warp_exploration: float = field(default=0.0, metadata={"help": (
        "standard deviation, in pixels per frame, of a random camera motion imposed on each "
        "candidate of a rollout (0 = off): a shift in x, a shift in y and a zoom (measured at "
        "the image edge), added to the warp head's affine flow of every frame of the "
        "candidate's clip (wc_fast.rl.rollout.warp_exploration_offsets). The update trains the "
        "model without the offset toward the candidates that scored well, so it distils the "
        "camera motion that followed the command: exploration in motion, where the noise "
        "alone moves the candidates of a group alike. Needs the embedded model with "
        "model.prediction warp and the NFT update (an offset the policy does not model has no "
        "log-probability for GRPO)")})
    action_exploration: float = field(default=0.0, metadata={"help": (
        "the same exploration through the model's action conditioning, for any backbone: "
        "each candidate's movement-key intensities (1 for a pressed key, 0 for the others) "
        "get an offset per key drawn from a normal of this standard deviation, held over the "
        "clip (wc_fast.rl.rollout.MotionExploration; 0 = off). The history and the update see "
        "the commanded keys alone. With train.update flow_grpo the recorded SDE steps are "
        "scored again under the commanded keys, so the PPO ratio starts at 1 as an on-policy "
        "one does")})


@dataclass(slots=True)
class RewardConfig:
    """IF (interaction following) and VQ (visual quality) rewards and how they become
    advantages (docs/design.md sections 4-6)."""

    lam: float = field(default=2.0 / 3.0, metadata={"help": (
        "weight in [0, 1] of IF in the combined advantage A = lam a_IF + (1 - lam) a_VQ")})
    Z: float = field(default=2.0, metadata={"help": (
        "scale of the optimality r = 1/2 + 1/2 clip(A / Z, -1, 1)")})
    std: StdMode = field(default="group", metadata={"help": (
        "what each reward's advantage is divided by: the unbiased std of its group (group, "
        "the paper) or over every group on every rank (global, the official code)")})
    kind: RewardKind = field(default="both", metadata={"help": (
        "which rewards make the advantage: both, if (IF alone) or vq (VQ alone)")})
    if_kind: IfKind = field(default="label", metadata={"help": (
        "label: the paper's IF (label accuracy, best translation threshold). soft: its smooth "
        "version (wc_fast.rewards.motion_spread.soft_interaction_score, at the smallest "
        "translation threshold), which ranks near misses above clear misses. action: the "
        "fraction of frames whose translation AND rotation labels are both right (the "
        "evaluation's action accuracy, read by the reward estimator); the label IF gives half "
        "credit for one of a combination's two keys, so it also rewards giving up the harder "
        "key. trajectory: World-R1's continuous reward exp(-(a e_t + b e_R)) of the per-frame "
        "pose errors against the commanded motion, (a, b) = reward.trajectory_weights "
        "(wc_fast.rewards.interaction.trajectory_score)")})
    if_reader: IfReader = field(default="estimator", metadata={"help": (
        "what reads each candidate's camera path for the IF reward. estimator: the reward "
        "estimator (a network, as the paper's pose estimator). render: the embedded world "
        "re-rendered along the world's key presses, the press whose render is closest to each "
        "frame (wc_fast.rewards.render_reader.press_track): a reader that needs no network and "
        "is validated on generated frames (docs/replication.md), an oracle for diagnosis that "
        "no real world offers. Needs rollouts of clip 1 only (rollout.num_clips 1, whose start "
        "pose is the prompt's) and no decoupled phases. fit: the classical camera fit "
        "(wc_fast.rewards.camera_fit.fit_path; no network, no renderer: a reader a policy "
        "cannot learn to please the way it learns a network's wishes), which costs 3.3 s per "
        "iteration of the cpu preset on 2 cores; the evaluation's fit column then reads with "
        "the reward's reader, so judge such a run by the estimator and the reader gap is 0. "
        "depth_anything_3: Depth Anything 3's camera poses (the depth-anything-3 package, "
        "weights from reward.reader_checkpoint), the paper's reader, for real video. The "
        "readers are registered by name in wc_fast.rewards.registry. agreement: the "
        "estimator and the fit both read each candidate and its IF is the lower of their two "
        "(credit only as far as a network and a classical reader agree; the fit's cost "
        "again), so a clip that pleases the network alone earns nothing extra; the reader "
        "gap then still compares the estimator with the fit. ensemble: the same two readers, "
        "the IF the mean of their two (half the credit where they disagree)")})
    reader_checkpoint: str = field(default="", metadata={"help": (
        "the local model folder of reward.if_reader depth_anything_3; with reward.if_reader "
        "estimator or agreement, an estimator file (NAME.safetensors, NAME.json beside it) "
        "that reads instead of the shipped reward estimator, e.g. the reader trained on "
        "generated frames labelled by the white-box reader (python -m "
        "wc_fast.tools.train_reward_models --which reward_generated --out DIR writes "
        "DIR/camera_reward_generated.safetensors); empty: the shipped one")})
    trajectory_weights: tuple[float, ...] = field(default=(1.0, 1.0), metadata={"help": (
        "(a, b): the weights of the translation and rotation errors in the trajectory IF "
        "(two numbers >= 0)")})
    rot_threshold_deg: float = field(default=1.0, metadata={"help": (
        "yaw or pitch (degrees per frame) above which a frame is labelled as turning")})
    trans_thresholds: tuple[float, ...] = field(default=(0.01, 0.02, 0.03, 0.04, 0.05),
                                                metadata={"help": (
        "translations per frame above which a frame is labelled as moving; the label IF "
        "takes the best of them")})
    vq_stride: int = field(default=4, metadata={"help": (
        "VQ scores every vq_stride-th new frame of a candidate")})
    vq_mode: VqMode = field(default="stride", metadata={"help": (
        "stride (paper): the critic's mean score over the strided frames; drift (official "
        "code): that mean minus the score of the first (context) frame")})
    critic: CriticKind = field(default="reward", metadata={"help": (
        "which critic scores VQ: the embedded reward, trained on degraded renders, or eval, "
        "the one python -m wc_fast.eval grades with (also trained on the base model's own "
        "generations), for studies of rewarding with the judge itself (both "
        "wc_fast.rewards.load_critic); hpsv3, the paper's HPSv3 (the hpsv3 package, weights "
        "from reward.critic_checkpoint), for real video")})
    critic_checkpoint: str = field(default="", metadata={"help": (
        "the local weights file of reward.critic hpsv3 (empty otherwise)")})
    decouple_every: int = field(default=0, metadata={"help": (
        "periodic decoupled training (World-R1, docs/design.md section 4.2), 0 = off: with "
        "decouple_every = K > 0, the last decouple_length = P iterations of every K "
        "(iteration k with k mod K >= K - P) suspend the IF reward, take their advantages "
        "from VQ alone (as reward.kind vq) and roll out high-motion prompts, so the update "
        "keeps the quality of moving views instead of rewarding a still camera")})
    decouple_length: int = field(default=1, metadata={"help": (
        "P: the VQ-only iterations at the end of every reward.decouple_every")})
    decouple_min_keys: int = field(default=2, metadata={"help": (
        "keys every clip of a decoupled iteration's prompts presses at least (drawn as key "
        "combinations of the rollout.composite_keys counts that reach it when it is 2 or "
        "more)")})


@dataclass(slots=True)
class NFTConfig:
    """WorldCompass's negative-aware fine-tuning update (``train.update nft``): which
    candidates it keeps and its loss."""

    beta: float = field(default=1.0, metadata={"help": (
        "the NFT loss's beta (> 0; docs/design.md section 7)")})
    loss_space: LossSpace = field(default="velocity", metadata={"help": (
        "space the NFT loss is computed in: velocity (paper) or x0 with the adaptive weight "
        "of docs/design.md section 7 (official code)")})
    keep: int = field(default=3, metadata={"help": (
        "candidates kept per group: this many with the highest advantage and as many with "
        "the lowest (2 * keep <= rollout.group_size)")})
    timestep_fraction: float = field(default=0.5, metadata={"help": (
        "each kept candidate is trained at ceil(timestep_fraction T) distinct sigmas of the "
        "T-step schedule, each with fresh noise")})
    kl_beta: float = field(default=0.0, metadata={"help": (
        "weight of the KL to the frozen initial model: the mean squared difference of the "
        "two models' velocities at the update's noisy clips, added to the loss (0 = none; the "
        "initial model is kept, frozen, only when kl_beta > 0). 0.1 in the recipe's presets "
        "(cpu, gpu, wan). The NFT update's alone: train.update flow_grpo reads grpo.kl_beta")})
    old_prediction: OldPrediction = field(default="old_model", metadata={"help": (
        "v_old of the loss: the old model's prediction (old_model, the paper) or the current "
        "model's, detached (detached_current, the official code: a plain weighted "
        "flow-matching loss without the old model's forward)")})
    latent_pairing: LatentPairing = field(default="fresh", metadata={"help": (
        "models with motion latents. fresh: the model gets the latents of each noisy clip's "
        "fresh training noise, as the forward process draws them, so positives and negatives "
        "teach every latent which motions to produce and to avoid. own: each kept candidate "
        "is trained with the latents it was generated from, written into its training noise "
        "as pretraining does; the model then already knows the candidate's motion, and the "
        "update has almost no motion to learn (tests/test_learnability.py)")})


@dataclass(slots=True)
class GRPOConfig:
    """Flow-GRPO / DanceGRPO's update, used with ``train.update flow_grpo`` (docs/design.md
    section 4.1); defaults are Flow-GRPO's (``yifan123/flow_grpo``, ``config/base.py``).

    The old model samples every candidate with the flow-matching SDE at noise level
    ``rollout.sde_noise`` and records each stochastic step's log-probability; the update is the
    PPO-clipped ratio of the current model's log-probability of that step to the recorded one,
    times the candidate's group advantage (:func:`wc_kernels.grpo_sde_loss`). The train phase
    runs as section ``update`` says.
    """

    clip_range: float = field(default=1e-4, metadata={"help": (
        "PPO clip range of the probability ratio, in [0, 1)")})
    adv_clip_max: float = field(default=5.0, metadata={"help": (
        "each candidate's group advantage is clipped to +-adv_clip_max")})
    kl_beta: float = field(default=0.0, metadata={"help": (
        "weight of the KL to the initial model (kept, frozen, only when kl_beta > 0)")})
    timestep_fraction: float = field(default=1.0, metadata={"help": (
        "the share of a candidate's stochastic steps it is trained on (a random subset per "
        "candidate); unused with grpo.window > 0")})
    window: int = field(default=0, metadata={"help": (
        "0 injects noise at every step but the last; N > 0 (Flow-GRPO-Fast) only at N "
        "consecutive steps placed at random per group, with ODE steps elsewhere, and trains "
        "all N")})
    same_noise: bool = field(default=False, metadata={"help": (
        "every candidate of a group starts from one initial noise (DanceGRPO) instead of its "
        "own (Flow-GRPO)")})
    on_policy: bool = field(default=True, metadata={"help": (
        "the model that samples is the current one after every update, as in Flow-GRPO, so "
        "the PPO ratio of each update starts at 1 (an EMA sampler's log-probabilities differ "
        "from the current model's by more than the 1e-4 clip range, and the clipped surrogate "
        "then passes almost no gradient); false samples with the EMA old model of section "
        "ema")})


@dataclass(slots=True)
class UpdateConfig:
    """How the train phase runs, for either update rule (``train.update``): the history cache
    the current model predicts over, the noisy clips per forward and backward, and
    compilation."""

    context_kv: ContextKv = field(default="recompute", metadata={"help": (
        "the history cache the current model predicts over: recompute (built again by the "
        "current model, without gradient), recompute_grad (built again with gradient through "
        "it), reuse (the old model's cache from the rollout)")})
    micro_batch: int = field(default=0, metadata={"help": (
        "noisy clips per forward and backward of the train phase (0 = automatic: all on "
        "CUDA, 32 on CPU)")})
    compile: bool = field(default=False, metadata={"help": (
        "run the current and old models' velocity in the train phase through torch.compile "
        "(fuses the per-element work around the matmuls, forward and backward): about 1.3x "
        "faster on CPU after minutes of compiling in the first iterations (the history length "
        "changes with the clip index, so there is one recompile); the compiled graphs are "
        "cached on disk for the next run. Timings in docs/experiment_log.md")})


@dataclass(slots=True)
class OptimConfig:
    """The RL update's optimizer and which weights it trains."""

    optimizer: Optimizer = field(default="muon", metadata={"help": (
        "muon: Muon on the hidden 2-D weights and AdamW on the rest (embeddings, output "
        "heads, norms and biases, which Muon is not meant for); adamw: AdamW on everything")})
    trainable: Trainable = field(default="all", metadata={"help": (
        "which weights RL updates. all, as the paper; conditioning, only the pathway from the "
        "command to the network (the model's conditioning_parameters(): action and motion "
        "embeddings and every adaLN modulation). A small update batch's gradient is mostly the "
        "candidates' appearance, which says nothing about the reward; frozen weights cannot "
        "soak it up, so the update changes what each command does and little else (measured "
        "in docs/experiment_log.md)")})
    lr: float = field(default=1e-5, metadata={"help": "learning rate (> 0)"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay"})
    grad_clip: float = field(default=0.0, metadata={"help": (
        "maximum gradient norm (0 = off)")})
    updates_per_iteration: int = field(default=1, metadata={"help": (
        "optimizer steps per iteration, the kept candidates shuffled and split between them "
        "(three in the official code)")})


@dataclass(slots=True)
class EMAConfig:
    """Old-model EMA decay schedule (see :func:`wc_fast.rl.ema.ema_decay`)."""

    schedule: EmaSchedule = field(default="linear", metadata={"help": (
        "linear: from ema.start to ema.end over the run (paper); official: min(0.9, 0.2 + "
        "0.01 k); constant: ema.start")})
    start: float = field(default=0.4, metadata={"help": (
        "decay at the first iteration (linear), or throughout (constant)")})
    end: float = field(default=0.8, metadata={"help": "decay at the last iteration (linear)"})


@dataclass(slots=True)
class TrainConfig:
    """The RL run: length, seeds, device, output, checkpointing, safety guards and logging."""

    steps: int = field(default=100, metadata={"help": "RL iterations"})
    seed: int = field(default=0, metadata={"help": "seed of every random stream of the run"})
    out: str = field(default="runs/wc_fast", metadata={"help": (
        "output directory: checkpoints, metrics.jsonl, plots")})
    device: Device = field(default="auto", metadata={"help": "auto (CUDA when there is one), "
                                                              "cpu or cuda"})
    ckpt_every: int = field(default=10, metadata={"help": "iterations between checkpoints"})
    keep_last: int = field(default=2, metadata={"help": "checkpoints kept"})
    distributed: Distributed = field(default="ddp", metadata={"help": (
        "multi-process runs: ddp all-reduces gradients; fsdp2 shards the current and old "
        "models (torch.distributed.fsdp.fully_shard)")})
    eval_at_end: bool = field(default=True, metadata={"help": (
        "evaluate the trained model on the held-out sets at the end (embedded tiny model "
        "only)")})
    init: str = field(default="base", metadata={"help": (
        "the weights RL starts from: base (the shipped base model, or the backbone in "
        "model.path), random (a new model) or a path to exported weights")})
    eval_sequences: int = field(default=8, metadata={"help": (
        "sequences per set in the end-of-run evaluation")})
    eval_clips: int = field(default=3, metadata={"help": (
        "clips per sequence in the end-of-run evaluation")})
    reader_gap_every: int = field(default=10, metadata={"help": (
        "every this many iterations (and at the first) the rollout's frames are also read by "
        "the classical camera fit, which no reward reads, and metrics.jsonl logs reader_gap: "
        "the label IF by the reward's reader minus the same IF by the fit. A gap that grows "
        "is reward the policy gets from its reader alone. 0 = never; it reads, it does not "
        "change training. Cost: the fit of a group's frames, 3.3 s per measured iteration of "
        "the cpu preset on 2 cores (its iteration takes 6 s), so about 6% at every 10th")})
    max_bad_updates: int = field(default=3, metadata={"help": (
        "an update whose loss or gradient holds a NaN or inf is skipped and counted; this "
        "many in a row stop the run with an error, after a checkpoint of the last good "
        "state")})
    max_update_ratio: float = field(default=1.0, metadata={"help": (
        "an optimizer step whose change of the trained weights has a norm above this multiple "
        "of their norm before it (both over all trained weights), or that leaves a weight NaN "
        "or inf, is undone and counted as a skipped update like a NaN one (a finite blow-up, "
        "e.g. a far too large optim.lr, instead of checkpointed as healthy). 0 = off: the "
        "guard keeps one copy of the trained weights while each step is checked")})
    loggers: tuple[str, ...] = field(default=("jsonl",), metadata={"help": (
        "where each iteration's metrics go: jsonl (metrics.jsonl, always: resume and the "
        "plots read it), tensorboard (event files under tensorboard/ in train.out; needs the "
        "tensorboard extra), wandb (a Weights & Biases run, offline unless an API key is "
        "configured; needs the wandb extra). Both trackers also get the resolved config and "
        "the reward and rollout plots, under torchtitan-style metric names "
        "(wc_fast.infra.metrics.TAGS)")})
    collective_timeout_s: float = field(default=1800.0, metadata={"help": (
        "multi-rank runs: the process-group timeout of every collective (also bounding how "
        "long ranks wait for rank 0's checkpoint writes and end-of-run evaluation), and how "
        "long a rank's heartbeat may go silent before its peers name it as stalled and exit, "
        "so that torchrun --max-restarts restarts the job from its newest checkpoint; seconds "
        "> 0 (default: gloo's own default)")})
    async_checkpoint: bool = field(default=False, metadata={"help": (
        "multi-rank runs (whose checkpoints are sharded, torch.distributed.checkpoint): write "
        "each checkpoint in the background (dcp.async_save) while the next iterations run; it "
        "is committed before the next checkpoint starts and before the run ends")})
    wandb_project: str = field(default="", metadata={"help": (
        "the W&B project of a wandb logger (empty: WANDB_PROJECT, else wc_fast)")})
    wandb_entity: str = field(default="", metadata={"help": (
        "the W&B entity (user or team; empty: WANDB_ENTITY or the account's default)")})
    wandb_group: str = field(default="", metadata={"help": (
        "the W&B group the run joins, e.g. one per sweep (empty: none)")})
    wandb_tags: tuple[str, ...] = field(default=(), metadata={"help": (
        "W&B tags of the run (comma-separated)")})
    wandb_checkpoints: bool = field(default=False, metadata={"help": (
        "log every checkpoint the run writes as a W&B model artifact (aliases step_N and "
        "latest), so another machine can fetch it")})
    update: Update = field(default="nft", metadata={"help": (
        "the policy update: nft, WorldCompass's negative-aware fine-tuning of the kept "
        "candidates (section nft); flow_grpo, the Flow-GRPO / DanceGRPO update of every "
        "candidate at its recorded SDE steps (section grpo); either's train phase runs as "
        "section update says")})


@dataclass(slots=True)
class Config:
    """A whole RL run (``python -m wc_fast.train``)."""

    preset: str = "paper"
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    nft: NFTConfig = field(default_factory=NFTConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


@dataclass(slots=True)
class PretrainConfig:
    """Flow-matching pretraining of an embedded world model (``python -m wc_fast.pretrain``,
    ``--base tiny`` or ``--base wan``)."""

    steps: int = field(default=3000, metadata={"help": "optimizer steps"})
    batch_size: int = field(default=8, metadata={"help": "sequences per step"})
    num_clips: int = field(default=3, metadata={"help": (
        "clips per sequence, all denoised in one teacher-forced forward")})
    lr: float = field(default=5e-4, metadata={"help": (
        "AdamW learning rate, after a linear warmup, then constant")})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    warmup: int = field(default=100, metadata={"help": "steps of linear learning-rate warmup"})
    grad_clip: float = field(default=1.0, metadata={"help": "maximum gradient norm (0 = off)"})
    ema: float = field(default=0.995, metadata={"help": (
        "decay in [0, 1) of the EMA weights that are evaluated and exported")})
    composite_fraction: float = field(default=0.1, metadata={"help": (
        "fraction of the sequences' clips that command a key combination (mostly basic "
        "keys, as WorldPlay's data)")})
    seed: int = field(default=0, metadata={"help": (
        "seed of the model's initialisation, the rendered batches and the noise")})
    out: str = field(default="runs/pretrain", metadata={"help": (
        "output directory: checkpoints, base_model.safetensors and its card, loss.jsonl")})
    ckpt_every: int = field(default=200, metadata={"help": "steps between checkpoints"})
    eval_every: int = field(default=500, metadata={"help": (
        "steps between scores of the live and EMA models on a fixed held-out batch")})
    keep_last: int = field(default=2, metadata={"help": "checkpoints kept"})
    max_minutes: float = field(default=0.0, metadata={"help": (
        "a wall-clock budget (0 = none); the run stops after the step that spends it, "
        "checkpoints and exports, and the card records the steps it ran")})
    init: str = field(default="", metadata={"help": (
        "exported weights (.safetensors with its card) to start from instead of a random "
        "model")})
    shift: float = field(default=5.0, metadata={"help": (
        "time shift of the training sigmas (> 0; the sampler's schedule passes through the "
        "same shift, rollout.shift)")})
    device: Device = field(default="auto", metadata={"help": "auto (CUDA when there is one), "
                                                              "cpu or cuda"})


@dataclass(slots=True)
class PretrainRun:
    """A whole pretraining run (``python -m wc_fast.pretrain``): the model it trains, and how.
    Kept apart from :class:`Config`, so no pretraining field is part of an RL run."""

    preset: str = "paper"
    model: ModelConfig = field(default_factory=ModelConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)


def sections(config_type: type) -> tuple[str, ...]:
    """The section names of a run config class (:class:`Config` or :class:`PretrainRun`)."""
    return tuple(f.name for f in dataclasses.fields(config_type) if f.name != "preset")


SECTIONS = sections(Config)
PRETRAIN_SECTIONS = sections(PretrainRun)
