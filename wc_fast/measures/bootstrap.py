"""Paired bootstrap confidence intervals of a change (trained minus base) over evaluation
sequences, and across training seeds where a row has several.

The base and the trained models are evaluated on the same sequences, so the change is taken
per sequence and the sequences are resampled together (paired). With several training seeds,
each bootstrap draw first resamples the seeds, then the sequences (the same sequence indices
for every drawn seed, as every seed saw the same evaluation set): the interval then holds both
the evaluation-set noise and the seed-to-seed spread.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_DRAWS = 10_000


def paired_bootstrap(base: Sequence[float] | np.ndarray, trained: Sequence | np.ndarray, *,
                     draws: int = DEFAULT_DRAWS, level: float = 0.95, seed: int = 0) -> dict:
    """Mean change and its percentile interval.

    ``base`` ``[n]`` (or ``[S, n]``, one base evaluation per seed) and ``trained`` ``[n]`` or
    ``[S, n]`` (one row per training seed) hold one value per evaluation sequence. Returns
    ``{"change", "low", "high", "se", "level", "sequences", "seeds"}``: the observed mean
    change, the ``level`` percentile interval of the bootstrap means and their standard
    deviation (the bootstrap standard error).
    """
    trained = np.atleast_2d(np.asarray(trained, dtype=np.float64))
    base = np.asarray(base, dtype=np.float64)
    if base.ndim not in (1, 2) or base.shape[-1] != trained.shape[-1] or trained.ndim != 2:
        raise ValueError(f"base must be [n] or [S, n] and trained [n] or [S, n] with one n, got "
                         f"{base.shape} and {trained.shape}")
    if base.ndim == 2 and base.shape[0] != trained.shape[0]:
        raise ValueError(f"base [S, n] must have one row per trained seed, got {base.shape} and "
                         f"{trained.shape}")
    if not 0.0 < level < 1.0 or draws < 1:
        raise ValueError(f"level must lie in (0, 1) and draws be >= 1, got {level}, {draws}")
    change = trained - base  # [S, n]
    seeds, n = change.shape
    rng = np.random.default_rng(seed)
    seed_idx = rng.integers(0, seeds, (draws, seeds)) if seeds > 1 else np.zeros((draws, 1), int)
    seq_idx = rng.integers(0, n, (draws, n))
    means = change[seed_idx[:, :, None], seq_idx[:, None, :]].mean((1, 2))
    tail = (1.0 - level) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return {"change": float(change.mean()), "low": float(low), "high": float(high),
            "se": float(means.std()), "level": level, "sequences": n, "seeds": seeds}


def sequence_values(result: dict, kind: str, metric: str,
                    clips: slice | None = None) -> np.ndarray:
    """One value per evaluation sequence ``[n]`` from a ``python -m wc_fast.eval --json``
    result: ``result[kind]["per_sequence"][metric]`` (``[n, N]``) averaged over ``clips``
    (all clips by default; ``slice(0, 1)`` for the trained clip alone). ``reader_gap`` is the
    estimator's accuracy minus the camera fit's, per sequence."""
    table = result.get(kind, {}).get("per_sequence", {})
    if metric == "reader_gap" and metric not in table:  # derived: estimator minus camera fit
        return (sequence_values(result, kind, "accuracy", clips)
                - sequence_values(result, kind, "fit_accuracy", clips))
    if metric not in table:
        raise KeyError(f"no per-sequence {metric!r} for set {kind!r}; have {sorted(table)}")
    values = np.asarray(table[metric], dtype=np.float64)
    return values[:, clips if clips is not None else slice(None)].mean(1)
