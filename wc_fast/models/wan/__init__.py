"""The Wan2.1-based world model: the DiT with action conditioning, its VAE, and the small
embedded Wan used for smoke runs."""
