"""Command-line programs that build and check the shipped reward models: they use the library
(rewards, world, evaluation rollouts), and nothing in the library imports them."""
