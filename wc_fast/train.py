"""``python -m wc_fast.train``: WorldCompass RL post-training (the main job)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from wc_fast import config as config_lib
from wc_fast.cli import parse_run_args


def main(argv: Sequence[str] | None = None) -> int:
    run = parse_run_args("python -m wc_fast.train", "WorldCompass RL post-training.", argv)
    print(config_lib.describe(run.config))
    print("wc_fast.train: the configuration above is valid; the RL training loop is not yet "
          "available in this version (it needs the world model, sampler and reward models).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
