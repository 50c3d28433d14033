"""One subpackage per op (``nft_loss``, ``flow_noise``, ``prefix_attention``,
``grpo_sde_loss``): its public function, plain-PyTorch reference (``naive``), Triton kernels,
native binding and ``torch.library`` registration (``library``). The functions are exported
from :mod:`wc_kernels`; import the modules from here (``wc_kernels.ops.nft_loss.naive``)."""
