"""The WorldPlay (HunyuanVideo-based) world model: the transformer, its camera
conditioning and modules, its VAE, and a tiny stand-in for smoke runs."""
