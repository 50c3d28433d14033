"""Study and diagnostic programs: the measurements behind docs/results.md.

Each module is a command, ``python -m studies.<name> --help``; the study's cached results are in
``studies/results/``. Benchmarks (pytest-benchmark) and the GPU check stay in ``bench/``.
"""
