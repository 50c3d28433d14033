"""What keeps a run going and visible: checkpoints, the run directory, metrics and plots,
devices, distributed setup, preemption, watchdogs and optional dependencies."""
