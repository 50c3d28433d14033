"""The change of every metric from a base model to a trained one (several results: one per
training seed), with paired 95% bootstrap intervals over the evaluation sequences (and the
seeds), for all clips, the trained clip 1 alone and clips 2 on.

Every result is a ``python -m wc_fast.eval --json`` result of the same evaluation (same sets,
seeds and sizes, checked). ``python -m wc_fast.tools.compare`` is the command line.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wc_fast.measures.bootstrap import paired_bootstrap, sequence_values

# metric key in ``per_sequence`` -> its name in the table: the classical camera fit's accuracy
# (a reader no reward reads) first, the estimator's beside it and the gap between the two,
# distance to the true render, the evaluation critic's VQ
COMPARED = {"fit_accuracy": "accuracy (camera fit)", "accuracy": "accuracy (estimator)",
            "reader_gap": "reader gap (estimator - fit)",
            "psnr": "PSNR (dB)", "ssim": "SSIM", "rot_err_deg": "rotation error (deg)",
            "trans_err": "translation error", "vq": "VQ (critic)"}
SETS = ("basic", "composite", "composite_2key")
# the settings two results must share to be paired sequence by sequence
PAIRED_SETTINGS = ("sequences", "clips", "seed", "steps", "shift", "trans_thresholds",
                   "rot_threshold_deg")


def clip_slices(clips: int) -> dict[str, slice]:
    """All clips, the trained clip 1 alone, clips 2 on (omitted for one clip)."""
    slices = {"all clips": slice(0, clips), "clip 1": slice(0, 1)}
    if clips > 1:
        slices["clips 2-on"] = slice(1, clips)
    return slices


def check_paired(base: dict, trained: Sequence[dict]) -> int:
    """Raise ``ValueError`` unless every result ran the base's evaluation; its clip count."""
    if not trained:
        raise ValueError("trained must hold at least one evaluation result")
    ref = {k: base["settings"][k] for k in PAIRED_SETTINGS}
    for i, result in enumerate(trained):
        got = {k: result["settings"][k] for k in PAIRED_SETTINGS}
        if got != ref:
            diff = {k: (ref[k], got[k]) for k in ref if ref[k] != got[k]}
            raise ValueError(f"trained result {i} ran another evaluation than the base "
                             f"(setting: (base, trained)): {diff}")
    return int(ref["clips"])


def compare(base: dict, trained: Sequence[dict], *, metrics: Sequence[str] = tuple(COMPARED),
            sets: Sequence[str] = SETS, draws: int = 10_000) -> list[dict]:
    """One row per (set, metric, clip slice): the base's and the trained models' means and the
    paired bootstrap change (:func:`paired_bootstrap`; ``trained`` ``[S]`` results resample
    seeds too). A metric missing from a result raises ``KeyError`` naming it."""
    clips = check_paired(base, trained)
    rows = []
    for kind in sets:
        for metric in metrics:
            for name, sl in clip_slices(clips).items():
                b = sequence_values(base, kind, metric, sl)
                t = np.stack([sequence_values(r, kind, metric, sl) for r in trained])
                rows.append({"set": kind, "metric": metric, "clips": name,
                             "base": float(b.mean()), "trained": float(t.mean()),
                             **paired_bootstrap(b, t, draws=draws)})
    return rows


def markdown(rows: Sequence[dict]) -> list[str]:
    """The rows as a Markdown table: change with its interval in brackets."""
    lines = ["| set | metric | clips | base | trained | change [95% CI] |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['set']} | {COMPARED.get(r['metric'], r['metric'])} | {r['clips']} "
                     f"| {r['base']:.3f} | {r['trained']:.3f} | {r['change']:+.3f} "
                     f"[{r['low']:+.3f}, {r['high']:+.3f}] |")
    return lines
