"""The RL loop: rollouts, advantages, the sampler, the update rules, EMA and the
optimiser setup the trainer drives."""
