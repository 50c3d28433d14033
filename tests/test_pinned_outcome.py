"""Training outcomes pinned across code versions: three iterations of the default run (the
``cpu`` preset on the shipped base, fixed seed) and its end-of-run evaluation must stay within
stated tolerances of the values measured when this test was written (2026-12-07, torch
2.13.0 CPU; measured again the same day when the preset's default gained the KL to the
initial model, nft.kl_beta 0.1, which moves the second and third losses and the trained
model), so that study rows trained on different days stay comparable. A change that moves
them on purpose updates the values here and says why in its commit.

Tolerances: the losses to 1e-3 relative (summation order and thread count move them by about
1e-6); accuracies to one frame in 16 (4 sequences x 1 clip of 4 new frames per set, read by
the estimator and by the fit); PSNR to 0.3 dB; VQ to 0.1.
"""

import json

import pytest

from wc_fast.train import main

LOSSES = [0.0479056698968634, 0.05934529926162213, 0.06286376086063683]
# set -> (estimator accuracy, fit accuracy, PSNR dB, VQ) of the trained model
TRAINED = {"basic": (0.9375, 0.875, 21.7472, -1.3701),
           "composite": (0.0, 0.3125, 16.2637, -3.7177),
           "composite_2key": (0.5625, 0.625, 19.8614, -4.4017)}
BASE = {"basic": (0.9375, 1.0, 21.3875, -1.1572),
        "composite": (0.0, 0.25, 16.2271, -3.7525),
        "composite_2key": (0.625, 0.625, 19.8698, -4.4166)}
ACCURACY, PSNR, VQ = 1 / 16 + 1e-9, 0.3, 0.1


@pytest.mark.slow
def test_three_iterations_of_the_default_run_stay_where_they_were(tmp_path):
    assert main(["--preset", "cpu", "--steps", "3", "--out", str(tmp_path),
                 "--train.eval_at_end", "true", "--train.eval_sequences", "4",
                 "--train.eval_clips", "1", "--train.reader_gap_every", "0"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["loss"] for row in rows] == pytest.approx(LOSSES, rel=1e-3)
    summary = json.loads((tmp_path / "summary.json").read_text())
    for name, pinned in (("base", BASE), ("trained", TRAINED)):
        for kind, (est, fit, psnr, vq) in pinned.items():
            got = summary[name][kind]
            where = f"{name} {kind}"
            assert got["accuracy"] == pytest.approx(est, abs=ACCURACY), where
            assert got["fit_accuracy"] == pytest.approx(fit, abs=ACCURACY), where
            assert got["metrics"]["all"]["psnr"] == pytest.approx(psnr, abs=PSNR), where
            assert got["vq"] == pytest.approx(vq, abs=VQ), where
