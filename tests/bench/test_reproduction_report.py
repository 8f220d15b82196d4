"""bench/reproduce.py's report and bench/studies.py's definitions: the choice made on validation classes, the
tables' mean ± sd, the paired t with Holm's correction and the PNG plots, checked on hand-made records whose
answers are worked out here."""

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import reproduce  # noqa: E402
import studies  # noqa: E402
from reproduction_plots import draw_all  # noqa: E402


def record(study, label, seed, test, val=None, epochs=8, batch=128, steps=688):
    """One run's record; its curve climbs to the final test/validation recall, its class count steps once."""
    out = {"study": study, "label": label, "seed": seed, "epochs": epochs, "batch": batch, "command": "python ...",
           "recall@1": test, "r_precision": test - 0.2, "map@r": test - 0.25, "step": steps,
           "curve": {"step": [0, steps], "recall@1": [test - 0.3, test], "map@r": [test - 0.5, test - 0.25],
                     "val_recall@1": [None, None] if val is None else [val - 0.3, val],
                     "val_map@r": [None, None] if val is None else [val - 0.5, val - 0.25]},
           "classes": [[1, 921], [steps // 2, 1842], [steps, 2763]],
           "loss": [[1, 9.0], [steps // 2, 4.0], [steps, 2.0 - test]]}
    if val is not None:
        out |= {"val_recall@1": val, "val_r_precision": val - 0.2, "val_map@r": val - 0.25}
    return out


def grid_records(best=(4, 10)):
    records = [record("grid", "baseline", s, 0.90 + 0.02 * s, 0.95) for s in range(3)]
    for n in studies.GRID_N:
        for m in studies.GRID_M:
            val = 0.97 if (n, m) == best else 0.93
            records += [record("grid", studies.memvir_label(n, m), s, 0.88, val + 0.001 * s) for s in range(3)]
    return records


@pytest.mark.parametrize("best", [(4, 10), (1, 50), (2, 10)])
def test_budget_study_takes_the_grids_best_validation_setting(best):
    records = grid_records(best)
    assert studies.chosen_on_validation(records) == best
    budget = studies.study_rows("budget", records)
    assert [(r.n, r.m, r.epochs) for r in budget] == [(0, 0, 24), (best[0], best[1], 24)]
    assert all(r.val_classes == 100 for r in budget)  # the budget runs hold the same validation classes out
    assert studies.chosen_on_validation(records[:-1]) is None  # a seed missing: no choice yet


def test_long_study_carries_the_budget_runs_on_from_their_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setattr(studies, "RUNS", tmp_path)
    records = grid_records(best=(1, 50))
    long_rows = studies.study_rows("long", records)
    # the budget rows, 48 epochs instead of 24, the same warm-up of 8 (so 24 more epochs continue them exactly)
    assert [(r.n, r.m, r.warmup, r.epochs) for r in long_rows] == [(0, 0, 0, 48), (1, 50, 8, 48)]
    budget = studies.study_rows("budget", records)[1].folder("budget", 2)
    budget.mkdir()
    (budget / "trainer_state.pt").write_bytes(b"24 epochs")
    out = long_rows[1].folder("long", 2)
    reproduce.continue_from("long", long_rows[1], 2, out, records)
    assert (out / "trainer_state.pt").read_bytes() == b"24 epochs"
    (out / "trainer_state.pt").write_bytes(b"30 epochs")  # a started continuation is never overwritten
    reproduce.continue_from("long", long_rows[1], 2, out, records)
    assert (out / "trainer_state.pt").read_bytes() == b"30 epochs"
    baseline_out = long_rows[0].folder("long", 2)  # no kept 24-epoch run: trains from scratch
    reproduce.continue_from("long", long_rows[0], 2, baseline_out, records)
    assert not baseline_out.exists()


def test_few_classes_rows_train_on_100_classes_and_evaluate_every_10_epochs():
    for row in studies.study_rows("few-classes", []):
        args = row.args(0)
        assert args[args.index("--val-classes") + 1] == "921"  # 1,021 - 921 = 100 training classes
        assert args[args.index("--eval-every") + 1] == "10" and args[args.index("--epochs") + 1] == "100"


def test_rows_hold_out_validation_classes_except_the_first_slice():
    row = studies.study_rows("grid", [])[1]
    assert row.args(3)[-2:] == ["--val-classes", "100"] and "--seed" in row.args(3)
    assert all(r.val_classes == 0 for r in studies.study_rows("losses", []))
    all_at_once = studies.study_rows("schedule", [])[2]
    assert all_at_once.args(0)[-4:-2] == ["--memvir-schedule", "all-at-once"]


def test_batch_study_separates_memory_age_and_step_count_from_the_batch():
    rows = {(r.batch, r.epochs, r.n, r.m, r.warmup) for r in studies.study_rows("batch", [])}
    # The glyph runs take 345 steps an epoch at batch 32, 86 at 128 and 43 at 256 (docs/reproduction.md), so M=50
    # at batch 128 is 0.58 epochs old; the same age is M=200 at batch 32 (200/345) and M=25 at batch 256 (25/43).
    at_8_epochs = {(32, 8, 0, 0, 0), (32, 8, 2, 50, 2), (32, 8, 2, 200, 2), (128, 8, 0, 0, 0), (128, 8, 2, 50, 2),
                   (256, 8, 0, 0, 0), (256, 8, 2, 50, 2), (256, 8, 2, 25, 2)}
    # 8 epochs at batch 128 are 688 steps with a 172-step warm-up: 2 epochs (690) with 0.5 at batch 32, 16 (688)
    # with 4 at batch 256
    equal_steps = {(32, 2, 0, 0, 0), (32, 2, 2, 50, 0.5), (256, 16, 0, 0, 0), (256, 16, 2, 50, 4)}
    assert rows == at_8_epochs | equal_steps
    # batch 128's scaled and equal-steps rows are the grid's runs, so they are not listed (nor trained) twice
    assert [r.label for r in studies.study_rows("batch", []) if r.batch == 128] == [
        "baseline, batch 128", "MemVir(2, 50), batch 128"]


def test_table_means_and_sample_deviations_by_hand():
    records = grid_records()
    table = reproduce.table(records, "grid").splitlines()
    # baseline test recall 90, 92, 94 %: mean 92.00, sample sd 2.00; R-Precision 20 points lower, MAP@R 25 lower;
    # validation Recall@1 95, MAP@R 95 - 25
    assert table[2] == ("| baseline | 128 | 8 | 3 | 92.00 ± 2.00 | 72.00 ± 2.00 | 67.00 ± 2.00 | 95.00 ± 0.00 "
                        "| 70.00 ± 0.00 |")
    # the batch study's batch-128 rows are the grid's runs, shown again rather than trained twice
    batch_table = reproduce.table(records, "batch").splitlines()
    assert batch_table[2:] == [
        "| baseline, batch 128 | 128 | 8 | 3 | 92.00 ± 2.00 | 72.00 ± 2.00 | 67.00 ± 2.00 | 95.00 ± 0.00 "
        "| 70.00 ± 0.00 |",
        "| MemVir(2, 50), batch 128 | 128 | 8 | 3 | 88.00 ± 0.00 | 68.00 ± 0.00 | 63.00 ± 0.00 | 93.10 ± 0.10 "
        "| 68.10 ± 0.10 |",
    ]


def test_every_study_gets_a_png_with_something_drawn(tmp_path):
    records = grid_records()
    records += [record("losses", row.label, s, 0.9 - 0.01 * bool(row.n)) for row in studies.study_rows("losses", [])
                for s in range(3)]
    records += [record("schedule", row.label, s, 0.89, 0.94) for row in studies.study_rows("schedule", [])[1:]
                for s in range(3)]
    records += [record("batch", row.label, s, 0.88, 0.94, batch=row.batch) for row in studies.study_rows("batch", [])
                for s in range(3)]
    records += [record("budget", row.label, s, 0.93, 0.97, epochs=24, steps=2064)
                for row in studies.study_rows("budget", records) for s in range(3)]
    records += [record("long", row.label, s, 0.94, 0.98, epochs=48, steps=4128)
                for row in studies.study_rows("long", records) for s in range(3)]
    records += [record("few-classes", row.label, s, 0.80, 0.70, epochs=100, steps=900)
                for row in studies.study_rows("few-classes", records) for s in range(3)]
    records += [record("dilution", row.label, s, 0.93 + 0.001 * i, 0.97, epochs=24, steps=2064)
                for i, row in enumerate(studies.study_rows("dilution", records)[1:]) for s in range(3)]
    records += [record("overfit-probe", row.label, 0, 0.70, 0.60, epochs=100, steps=900)
                for row in studies.study_rows("overfit-probe", records)]
    records += [record("overfit", row.label, s, 0.40, 0.43, epochs=60, steps=540)
                for row in studies.study_rows("overfit", records) for s in range(3)]
    records += [record("preset", row.label, s, 0.92, 0.95, epochs=12, steps=1032)
                for row in studies.study_rows("preset", records) for s in range(3)]
    paths = draw_all(records, tmp_path)
    assert sorted(p.name for p in paths) == ["batch.png", "budget.png", "dilution.png", "few-classes.png", "grid.png",
                                             "long.png", "losses.png", "overfit-probe.png", "overfit.png",
                                             "preset.png", "schedule.png"]
    for path in paths:
        with Image.open(path) as image:
            assert image.format == "PNG" and image.width >= 500 and image.height >= 350
            pixels = np.asarray(image.convert("L"), dtype=float)
        assert (pixels < 128).mean() > 0.005, path.name  # axes, bars and text, not a blank page


def test_dilution_rows_take_the_ablation_flags_and_share_the_budget_runs():
    rows = {row.label: row for row in studies.study_rows("dilution", [])}
    halved = rows["baseline, loss x0.5 after warm-up"].args(1)
    assert halved[halved.index("--loss-scale-after-warmup") + 1] == "0.5"
    assert halved[halved.index("--warmup-epochs") + 1] == "8" and halved[halved.index("--memvir-n") + 1] == "0"
    assert rows["MemVir(1, 50, balanced)"].args(0)[-2:] == ["--memvir-reduction", "balanced"]
    assert rows["baseline, Adam eps 1e-8"].args(0)[-2:] == ["--adam-eps", "1e-08"]
    assert all(row.epochs == 24 and row.val_classes == 100 for row in rows.values())
    assert len({row.folder("dilution", 0) for row in rows.values()}) == len(rows)  # no two rows share a folder
    # its own baseline and official MemVir, trained on this machine beside the other rows, not the budget study's
    budget = [record("budget", "baseline", s, 0.95, 0.93) for s in range(3)]
    assert studies.rows_of(budget, "dilution", "baseline") == []
    assert rows["baseline"].args(0) == studies.study_rows("budget", grid_records(best=(1, 50)))[0].args(0)


def test_overfit_probe_rows_train_without_augmentation_on_few_classes_with_one_seed():
    for row, classes in zip(studies.study_rows("overfit-probe", []), (100, 50), strict=True):
        args = row.args(0)
        assert "--no-augment" in args and row.seeds == (0,)
        assert 1021 - int(args[args.index("--val-classes") + 1]) == classes


def test_paired_t_pairs_runs_by_seed_by_hand():
    """a = 1, 2, 3 % at seeds 0, 1, 2 and b = 2, 4, 6 % (listed in another order): d = 1, 2, 3, mean 2, sd 1,
    t = 2 / (1 / sqrt(3)) = 3.4641 with 2 degrees of freedom. Unpaired (Welch) it would be 1.549."""
    from scipy.stats import t as student

    first = [{"seed": s, "recall@1": v / 100} for s, v in enumerate((1, 2, 3))]
    second = [{"seed": s, "recall@1": v / 100} for s, v in ((2, 6), (0, 2), (1, 4))]
    test = studies.paired(first, second, "recall@1")
    assert test.mean_diff == pytest.approx(2.0)
    assert test.t == pytest.approx(2 * 3 ** 0.5, rel=1e-9)
    assert test.p == pytest.approx(2 * student.sf(2 * 3 ** 0.5, 2), rel=1e-9)
    assert studies.paired(first, [{"seed": 7, "recall@1": 0.1}], "recall@1") is None  # nothing pairs up


def test_differences_table_is_paired_with_holm_over_the_table():
    from scipy.stats import t as student

    records = [record("budget", "baseline", s, 0.90 + 0.01 * s, 0.93 + 0.01 * s) for s in range(3)]
    records += [record("budget", "MemVir(1, 50)", s, 0.92 + 0.02 * s, 0.94 + 0.03 * s) for s in range(3)]
    lines = reproduce.differences(records, "budget").splitlines()
    # test metrics: d = 2, 3, 4 points (mean 3, sd 1), t = 3 sqrt(3); validation: d = 1, 3, 5 (mean 3, sd 2)
    p_test, p_val = 2 * student.sf(3 * 3 ** 0.5, 2), 2 * student.sf(3 / (2 / 3 ** 0.5), 2)
    # Holm over the 5 tests, three at p_test and two at p_val: the smallest is multiplied by 5, a running maximum
    holm_test = 5 * p_test
    holm_val = max(holm_test, 2 * p_val)
    cells = [c.strip() for c in lines[2].split("|")[2:-1]]
    assert lines[2].startswith("| MemVir(1, 50) − baseline |")
    assert cells[0] == f"+3.00 (t 5.2, p {p_test:.3f}; Holm {holm_test:.2f})"
    assert cells[3] == f"+3.00 (t 2.6, p {p_val:.2f}; Holm {holm_val:.2f})"


def test_differences_table_sets_a_difference_past_holm_in_bold():
    """Every seed 5 points apart in every metric: each paired t is infinite, p 0, so every cell is a verdict."""
    records = [record("budget", "baseline", s, 0.90 + 0.01 * s, 0.90 + 0.01 * s) for s in range(3)]
    records += [record("budget", "MemVir(1, 50)", s, 0.95 + 0.01 * s, 0.85 + 0.01 * s) for s in range(3)]
    cells = [c.strip() for c in reproduce.differences(records, "budget").splitlines()[2].split("|")[2:-1]]
    assert cells[0].startswith("**+5.00** (t inf, p < 0.001; Holm < 0.001)")
    assert cells[3].startswith("**-5.00** (t -inf")
