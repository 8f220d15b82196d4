"""bench/fair_study.py's protocol, checked on records and run folders written here: equal budgets (the same optimiser
points for every arm, N and M within the trials), the choice on validation folds only, what runs when, and the
comparisons' paired statistics with Holm's correction."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import fair_study  # noqa: E402
from fair_study import (  # noqa: E402
    ARMS,
    PROFILES,
    Results,
    Setting,
    chosen_settings,
    pending_jobs,
    shown_command,
    trial_setting,
)

CPU = PROFILES["cpu"]
FIRST = fair_study.BOXES["first"]
OPTIMISER = ("lr", "class_lr", "adam_eps", "scale")


def test_every_arm_gets_the_same_optimiser_points_and_the_memvir_arms_the_same_n_and_m():
    for trial in range(CPU.trials):
        settings = {arm: trial_setting(arm, trial, CPU.trials) for arm in CPU.arms}
        points = {tuple(getattr(s, name) for name in OPTIMISER) for s in settings.values()}
        assert len(points) == 1, trial  # one optimiser point per trial, whatever the arm
        official, balanced = settings["memvir-official"], settings["memvir-balanced"]
        assert (official.n, official.m) == (balanced.n, balanced.m) and settings["baseline"].n == 0
        assert (official.reduction, balanced.reduction) == ("official", "balanced")
    assert trial_setting("baseline", 0, CPU.trials) == ARMS["baseline"]  # trial 0: the page's settings
    assert trial_setting("memvir-official", 0, CPU.trials) == ARMS["memvir-official"]


def test_the_trials_stay_in_the_search_space_and_use_every_adam_eps():
    drawn = [trial_setting("memvir-official", t, CPU.trials) for t in range(1, CPU.trials)]
    assert {s.adam_eps for s in drawn} == set(fair_study.ADAM_EPS)  # 5 points over 4 values: none left out
    for s in drawn:
        assert FIRST.lr[0] <= s.lr <= FIRST.lr[1]
        assert FIRST.class_lr[0] <= s.class_lr <= FIRST.class_lr[1]
        assert FIRST.scale[0] <= s.scale <= FIRST.scale[1]
        assert s.n in fair_study.MEMVIR_N and s.m in fair_study.MEMVIR_M
    # a Latin hypercube: each fifth of the log learning-rate range holds one point
    low, high = np.log(FIRST.lr)
    strata = sorted(int((np.log(s.lr) - low) / (high - low) * 5) for s in drawn)
    assert strata == [0, 1, 2, 3, 4]


WIDE = PROFILES["wide"]


def test_the_widened_search_gives_the_baseline_its_multiplier_in_as_many_trials_as_both_reductions():
    """The baseline's 12 trials are the six shared points at x1 and again at x2 or x5 after the warm-up (each three
    times); every MemVir arm, the seen-labels memory included, searches the same six points and the same N and M."""
    assert {arm: WIDE.arm_trials(arm) for arm in WIDE.arms} == {
        "baseline": 12, "memvir-official": 6, "memvir-balanced": 6, "memvir-seen": 6}
    baseline = [WIDE.trial("baseline", t) for t in range(12)]
    for t in range(6):
        assert baseline[t].loss_scale_after_warmup == 1.0
        assert baseline[t + 6] == replace(baseline[t], loss_scale_after_warmup=baseline[t + 6].loss_scale_after_warmup)
        settings = [WIDE.trial(arm, t) for arm in WIDE.arms]
        assert len({tuple(getattr(s, name) for name in OPTIMISER) for s in settings}) == 1
        official, seen = WIDE.trial("memvir-official", t), WIDE.trial("memvir-seen", t)
        assert (seen.n, seen.m, seen.labels, seen.reduction) == (official.n, official.m, "seen", "official")
    assert sorted(s.loss_scale_after_warmup for s in baseline[6:]) == [2.0, 2.0, 2.0, 5.0, 5.0, 5.0]
    wide = fair_study.BOXES["wide"]
    for s in (WIDE.trial("memvir-balanced", t) for t in range(1, 6)):
        assert wide.lr[0] <= s.lr <= wide.lr[1] and wide.scale[0] <= s.scale <= wide.scale[1]
    # the search's runs: 12 baseline trials and 6 for each of three MemVir arms, on both folds; no final yet
    jobs = pending_jobs(Results(Path("/nonexistent/results.json")), WIDE)
    assert len(jobs) == 2 * (12 + 3 * 6) and {job.phase for job in jobs} == {"search"}
    with pytest.raises(ValueError, match="no trial 6"):
        WIDE.trial("memvir-official", 6)


def test_a_choice_within_a_tenth_of_a_range_s_end_lies_on_the_box_s_edge():
    wide, first = fair_study.BOXES["wide"], fair_study.BOXES["first"]
    # lr 5.5e-5: log(5.5e-5 / 5e-5) / log(3e-3 / 5e-5) = 0.095 / 4.094 = 0.023 of the range: low edge;
    # scale 39: (39 - 6) / 34 = 0.97: high edge; class lr 4e-3: log(8) / log(60) = 0.51: inside
    assert fair_study.box_edges(Setting(lr=5.5e-5, class_lr=4e-3, scale=39.0), wide) == [
        "lr 5.5e-05 at the low edge (5e-05)", "scale 39 at the high edge (40)"]
    # the first study's baseline choice: lr at 0.07 of its box and scale at 0.05 (class lr at 0.17: inside);
    # in the widened box the same point lies inside in every dimension (0.48, 0.53, 0.21)
    first_choice = Setting(lr=0.000351, class_lr=0.00443, scale=13.3, adam_eps=1e-8)
    assert [edge.split()[0] for edge in fair_study.box_edges(first_choice, first)] == ["lr", "scale"]
    assert fair_study.box_edges(first_choice, wide) == []


def test_a_grown_box_reaches_a_third_of_its_range_past_the_edge_and_adds_two_trials_there():
    wide = fair_study.BOXES["wide"]
    # lr 5e-5 to 3e-3 spans a factor 60: a third of it on a log scale is 60 ** (1/3) = 3.9149, so the low end moves
    # to 5e-5 / 3.9149 = 1.2772e-5; the scale's 6 to 40 (a factor 6.667, cube root 1.8821) reaches 40 x 1.8821 = 75.28
    grown = fair_study.grown_box(wide, [("lr", -1), ("scale", 1)])
    assert grown.lr == pytest.approx((1.2772e-5, 3e-3), rel=1e-4)
    assert grown.scale == pytest.approx((6.0, 75.28), rel=1e-4)
    assert grown.class_lr == wide.class_lr
    # the wide search's trial 4 (lr 6.6e-5, scale 7.6) lies on the low edge of both: halfway (log) between the old and
    # the grown end, then the grown end: lr sqrt(5e-5 x 1.2772e-5) = 2.527e-5, 1.2772e-5; scale 6 / 1.8821 = 3.188,
    # sqrt(6 x 3.188) = 4.374
    choice = WIDE.trial("baseline", 4)
    ends = fair_study._edge_ends(choice, wide)
    assert ends == [("lr", -1), ("scale", -1)]
    added = fair_study.growth_trials(choice, ends, wide, fair_study.grown_box(wide, ends))
    trials = [trial for trial, _ in added]
    assert [(t.lr, t.scale) for t in trials] == [(2.53e-5, 7.6), (1.28e-5, 7.6), (choice.lr, 4.4), (choice.lr, 3.2)]
    assert {(t.class_lr, t.adam_eps, t.n) for t in trials} == {(choice.class_lr, choice.adam_eps, 0)}
    # the trials at a grown end are the ones whose win grows the box again
    assert [reaches for _, reaches in added] == [None, ("lr", -1), None, ("scale", -1)]


def _scores(profile, arm, scores):
    """Search records of `arm` in `profile` with these mean validation MAP@R, one per trial (both folds alike)."""
    return [{"profile": profile.name, "phase": "search", "arm": arm, "trial": t, "fold": f, "seed": 0,
             "metrics": {"val_map@r": score}} for t, score in enumerate(scores) for f in range(profile.folds)]


def test_a_choice_on_the_edge_grows_its_arm_s_box_and_the_finals_wait_for_the_trials_there(tmp_path):
    others = [record for arm in WIDE.arms[1:] for record in _scores(WIDE, arm, [0.5, 0.9, 0.5, 0.5, 0.5, 0.5])]
    # the baseline's trial 4 wins: lr and scale on their low edges (the other arms choose trial 1, inside)
    baseline = [0.5] * 12
    baseline[4] = 0.9
    results = _results(tmp_path, others + _scores(WIDE, "baseline", baseline))
    search = fair_study.arm_search(results, WIDE, "baseline")
    assert search.chosen is None and search.growths == 1 and len(search.trials) == 16
    assert search.box.lr == pytest.approx((1.2772e-5, 3e-3), rel=1e-4)
    jobs = pending_jobs(results, WIDE)
    assert {job.phase for job in jobs} == {"search"}  # no final of any arm before the baseline's box is settled
    assert [(job.trial, job.fold) for job in jobs] == [(t, f) for t in range(12, 16) for f in (0, 1)]
    assert [job.setting.lr for job in jobs[::2]] == [2.53e-5, 1.28e-5, *[WIDE.trial("baseline", 4).lr] * 2]
    assert set(chosen_settings(results, WIDE)) == {"memvir-official", "memvir-balanced", "memvir-seen"}
    assert "Boxes grown past a chosen value" in fair_study.search_table(results, WIDE)

    # the new trials score lower: trial 4 stays the choice, inside what was searched: the search is done and the
    # finals start from it
    settled = _results(tmp_path, others + _scores(WIDE, "baseline", baseline + [0.8, 0.7, 0.8, 0.7]))
    assert chosen_settings(settled, WIDE)["baseline"] == WIDE.trial("baseline", 4)
    jobs = pending_jobs(settled, WIDE)
    assert {job.phase for job in jobs} == {"final", "control"}
    # every arm and both schedule controls at ten seeds, seed by seed
    controls = ("schedule-balanced-optimiser", "schedule-baseline-optimiser")
    batch = fair_study.next_batch(jobs, WIDE, tmp_path / "runs")
    assert [(job.seed, job.arm) for job in batch] == [
        (seed, name) for seed in range(10) for name in (*WIDE.arms, *controls)]
    # a stopped run first (its checkpoint is there): a restarted study finishes what it had started
    stopped = tmp_path / "runs" / "wide" / "control-schedule-baseline-optimiser-s3" / "trainer_state.pt"
    stopped.parent.mkdir(parents=True)
    stopped.write_bytes(b"")
    assert fair_study.next_batch(jobs, WIDE, tmp_path / "runs")[0].name == "control-schedule-baseline-optimiser-s3"

    # the grown end wins: the box grows again past it (lr's low end to 1.2772e-5 / (3e-3 / 1.2772e-5) ** (1/3))
    again = _results(tmp_path, others + _scores(WIDE, "baseline", baseline + [0.8, 0.95, 0.8, 0.7]))
    search = fair_study.arm_search(again, WIDE, "baseline")
    assert search.chosen is None and search.growths == 2
    assert search.box.lr[0] == pytest.approx(1.2772e-5 / (3e-3 / 1.2772e-5) ** (1 / 3), rel=1e-4)
    assert search.box.scale == pytest.approx((3.188, 40.0), rel=1e-3)  # the scale's growth stays, not repeated


def test_two_controls_of_one_command_train_once_and_the_second_is_recorded_as_the_same_run(tmp_path, monkeypatch):
    # every arm chooses trial 1, the baseline at x1: balanced's optimiser is the baseline's, so the two step-schedule
    # controls are one command (as in the widened search)
    records = [record for arm in WIDE.arms for record in
               _scores(WIDE, arm, [0.5, 0.9] + [0.5] * (WIDE.arm_trials(arm) - 2))]
    results = _results(tmp_path, records)
    chosen = chosen_settings(results, WIDE)
    assert chosen["baseline"] == replace(chosen["memvir-balanced"], n=0, m=50, reduction="official")
    controls = ("schedule-balanced-optimiser", "schedule-baseline-optimiser")
    twins = [fair_study.control_setting(name, chosen) for name in controls]
    assert twins[0] == twins[1]
    batch = fair_study.next_batch(pending_jobs(results, WIDE), WIDE, tmp_path / "runs")
    # the first control of each seed trains; its twin waits for the next batch
    assert [(job.seed, job.arm) for job in batch] == [
        (seed, name) for seed in range(10) for name in (*WIDE.arms, controls[0])]

    monkeypatch.setattr(fair_study, "_commit", lambda: "abc")
    trained = {**fair_study.Job("control", controls[0], twins[0], seed=3).keys(WIDE), "setting":
               fair_study.asdict(twins[0]), "device": "cpu", "commit": "abc", "command": "python -m memvir train x",
               "metrics": {"map@r": 0.7}, "per_query": "per_query/wide-control-x-s3.npz"}
    results.add(trained)
    job = fair_study.Job("control", controls[1], twins[1], seed=3)
    assert fair_study.next_batch([job], WIDE, tmp_path / "runs") == [job]
    fair_study.run_job(job, WIDE, results, tmp_path / "runs", threads=1, device="cpu")  # trains nothing
    assert not (tmp_path / "runs" / "wide").exists()
    copy = results.find(**job.keys(WIDE))
    assert copy == {**trained, "arm": controls[1], "same_as": f"control-{controls[0]}-s3"}
    # not the same run: another seed, another device or another commit
    assert fair_study.recorded_twin(replace(job, seed=4), WIDE, results, "cpu") is None
    assert fair_study.recorded_twin(job, WIDE, results, "cuda") is None
    monkeypatch.setattr(fair_study, "_commit", lambda: "def")
    assert fair_study.recorded_twin(job, WIDE, results, "cpu") is None


def test_a_best_trial_halfway_into_a_grown_range_is_the_choice_though_near_the_grown_end(tmp_path):
    """The scale grown from 6 to 3.19 (log scale): its halfway trial 4.4 lies at (4.4 - 3.19) / (40 - 3.19) = 0.033
    of the grown range, within a tenth of its end; it won against 3.2 and 7.6, so the optimum is bracketed and the
    box does not grow again (judged by the first rule it grew three more times, down to a scale of 0.4)."""
    others = [record for arm in WIDE.arms[1:] for record in _scores(WIDE, arm, [0.5, 0.9, 0.5, 0.5, 0.5, 0.5])]
    baseline = [0.5] * 12
    baseline[4] = 0.9
    results = _results(tmp_path, others + _scores(WIDE, "baseline", baseline + [0.8, 0.7, 0.95, 0.85]))
    search = fair_study.arm_search(results, WIDE, "baseline")
    assert search.growths == 1 and search.edges == [] and len(search.trials) == 16
    assert (search.chosen.lr, search.chosen.scale) == (WIDE.trial("baseline", 4).lr, 4.4)
    assert fair_study._edge_ends(search.chosen, search.box) == [("scale", -1)]  # what the first rule would say
    assert "Still on the box's edge" not in fair_study.search_table(results, WIDE)
    assert {job.phase for job in pending_jobs(results, WIDE)} == {"final", "control"}


def test_the_schedule_controls_replace_the_baseline_s_chosen_multiplier_and_seen_labels_face_virtual(tmp_path):
    """A baseline that chose its loss x2 after the warm-up: the schedule control at its optimiser takes balanced's
    schedule instead (not both); and virtual against seen labels is a row of the widened search's comparisons."""
    baseline = [0.5] * 12
    baseline[7] = 0.9  # trial 1's point with the loss x2 after the warm-up
    records = _scores(WIDE, "baseline", baseline) + [
        record for arm in WIDE.arms[1:] for record in _scores(WIDE, arm, [0.5, 0.9, 0.5, 0.5, 0.5, 0.5])]
    jobs = pending_jobs(_results(tmp_path, records), WIDE)
    chosen = {job.arm: job.setting for job in jobs if job.seed == 0}
    assert chosen["baseline"].loss_scale_after_warmup == 2.0
    control = chosen["schedule-baseline-optimiser"]
    assert control == replace(chosen["baseline"], loss_scale_after_warmup=1.0, m=chosen["memvir-balanced"].m,
                              loss_scale_schedule=chosen["memvir-balanced"].n)
    assert ("memvir-seen", "memvir-official") in fair_study.COMPARISONS


def test_the_box_grows_at_most_three_times_and_a_profile_that_does_not_grow_only_reports_the_edge(tmp_path):
    # every growth's grown lr end wins: trial 4 grows lr and scale (4 trials, the lr's end 13 best), then only the lr
    # lies on the edge (scale 7.6 is inside the grown 3.19 to 40): 2 trials a growth, the end (17, then 19) best
    scores = [0.5] * 12
    scores[4] = 0.6
    scores += [0.5, 0.7, 0.5, 0.5] + [0.5, 0.71] + [0.5, 0.72]
    results = _results(tmp_path, _scores(WIDE, "baseline", scores))
    search = fair_study.arm_search(results, WIDE, "baseline")
    assert search.growths == fair_study.GROWTHS == 3 and len(search.trials) == 20
    assert search.chosen == search.trials[19] and search.edges == [("lr", -1)]
    assert "Still on the box's edge after 3 growths" in fair_study.search_table(results, WIDE)
    # the first study's profile chose on its edge and did not grow: its choice is the plain best trial
    first = [0.5] * CPU.trials
    first[2] = 0.9
    cpu = _results(tmp_path, _scores(CPU, "baseline", first))
    assert fair_study.arm_search(cpu, CPU, "baseline").growths == 0
    assert chosen_settings(cpu, CPU)["baseline"] == trial_setting("baseline", 2, CPU.trials)


def _search_record(arm, trial, fold, val_map):
    return {"profile": "cpu", "phase": "search", "arm": arm, "trial": trial, "fold": fold, "seed": 0,
            "metrics": {"val_map@r": val_map}}


def _results(tmp_path, records) -> Results:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(records))
    return Results(path)


def test_the_choice_is_the_best_mean_validation_map_at_r_over_the_folds_once_every_trial_is_in(tmp_path):
    # trial 2 wins on the mean (0.80 + 0.90) / 2 = 0.85 though trial 4 has the best single fold (0.95, mean 0.70)
    scores = {0: (0.70, 0.72), 1: (0.80, 0.60), 2: (0.80, 0.90), 3: (0.84, 0.84), 4: (0.95, 0.45), 5: (0.10, 0.20)}
    records = [_search_record("baseline", t, f, s[f]) for t, s in scores.items() for f in (0, 1)]
    assert chosen_settings(_results(tmp_path, records[:-1]), CPU) == {}  # one fold missing: no choice yet
    chosen = chosen_settings(_results(tmp_path, records), CPU)
    assert chosen == {"baseline": trial_setting("baseline", 2, CPU.trials)}


def test_equal_scores_choose_the_earlier_trial(tmp_path):
    records = [_search_record("baseline", t, f, 0.5) for t in range(CPU.trials) for f in (0, 1)]
    assert chosen_settings(_results(tmp_path, records), CPU)["baseline"] == trial_setting("baseline", 0, CPU.trials)


def test_finals_wait_for_their_arms_search_and_controls_start_from_the_chosen_settings(tmp_path):
    assert {job.phase for job in pending_jobs(_results(tmp_path, []), CPU)} == {"search"}
    search = [_search_record(arm, t, f, 0.5 + 0.01 * t * (arm == "baseline"))
              for arm in CPU.arms for t in range(CPU.trials) for f in (0, 1)]
    jobs = pending_jobs(_results(tmp_path, search), CPU)
    assert {job.phase for job in jobs} == {"final", "control"}
    finals = [job for job in jobs if job.phase == "final"]
    # seed by seed: every arm's seed 0 before any seed 1, so a study stopped part-way has whole seeds to pair
    assert [(job.seed, job.arm) for job in finals] == [(s, arm) for s in CPU.seeds for arm in CPU.arms]
    best_baseline = trial_setting("baseline", CPU.trials - 1, CPU.trials)  # the scores rise with the trial
    controls = {job.arm: job.setting for job in jobs if job.phase == "control" and job.seed == 0}
    assert controls["baseline-class-lr-x2"].class_lr == pytest.approx(2 * best_baseline.class_lr)
    assert controls["baseline-loss-x2"].loss_scale_after_warmup == 2.0 and controls["baseline-loss-x2"].n == 0
    assert controls["balanced-eps-1e-8"].adam_eps == 1e-8
    assert controls["seen-labels"].labels == "seen" and controls["seen-labels"].reduction == "official"
    # a search job's command holds out a fold and evaluates only at the end; a final trains on every class
    search_job = pending_jobs(_results(tmp_path, []), CPU)[0]
    assert search_job.args(CPU)[-6:] == ["--val-classes", "255", "--val-fold", "0", "--eval-every", "0"]
    assert "--val-classes" not in finals[0].args(CPU)


def _run_folder(folder: Path, records) -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return folder


def test_a_search_trial_keeps_only_validation_metrics_and_the_adam_share_after_the_warm_up(tmp_path):
    final = {"type": "eval", "step": 20, "epoch": 2, "recall@1": 0.9, "r_precision": 0.5, "map@r": 0.4,
             "val_recall@1": 0.95, "val_r_precision": 0.6, "val_map@r": 0.55}
    steps = [{"type": "step", "step": 10, "warmup": True, "adam_eps_share": 0.2, "adam_eps_share_class": 0.0},
             {"type": "step", "step": 20, "warmup": False, "adam_eps_share": 0.8, "adam_eps_share_class": 0.1},
             {"type": "step", "step": 30, "warmup": False, "adam_eps_share": 0.6, "adam_eps_share_class": 0.3}]
    run = _run_folder(tmp_path / "run", [*steps, final])
    searched = fair_study.read_run(run, test=False)
    assert searched["metrics"] == {"val_recall@1": 0.95, "val_r_precision": 0.6, "val_map@r": 0.55}  # no test metric
    assert searched["adam_eps_share"] == pytest.approx(0.7) and searched["adam_eps_share_class"] == pytest.approx(0.2)
    assert fair_study.read_run(run, test=True)["metrics"]["map@r"] == 0.4


def test_comparisons_are_paired_over_seeds_and_holm_corrected_over_the_table(tmp_path):
    labels = np.repeat(np.arange(10), 3).astype(np.int16)
    records = []
    for arm, shift in (("baseline", 0.0), ("memvir-official", 0.02), ("memvir-balanced", 0.01)):
        for seed in range(5):
            values = np.full(30, 0.5 + shift + 0.001 * seed, dtype=np.float32)
            name = f"per_query/{arm}-s{seed}.npz"
            (tmp_path / "per_query").mkdir(exist_ok=True)
            np.savez(tmp_path / name, label=labels, recall_at_1=values > 0.5, map_at_r=values)
            metrics = {"recall@1": 0.9 + shift + 0.003 * seed * (seed % 2), "r_precision": 0.5 + shift,
                       "map@r": 0.4 + shift + 0.001 * seed ** 2}
            records.append({"profile": "cpu", "phase": "final", "arm": arm, "seed": seed, "trial": None,
                            "fold": None, "metrics": metrics, "per_query": name})
    rows = fair_study.comparisons(_results(tmp_path, records), CPU)
    by_key = {(row["reference"], row["other"], row["metric"]): row for row in rows}
    memvir_map = by_key["baseline", "memvir-official", "map@r"]
    assert memvir_map["seeds"] == 5 and memvir_map["t"].mean_diff == pytest.approx(2.0)
    # the same per-seed shift at every seed: the paired differences have no spread
    assert memvir_map["t"].p < 1e-10 and memvir_map["class_ci"] == pytest.approx((2.0, 2.0), abs=1e-4)
    # Holm: the smallest p times the number of tests, and never below a raw p
    raw = sorted(row["t"].p for row in rows)
    assert min(row["holm"] for row in rows) == pytest.approx(min(1.0, raw[0] * len(rows)))
    assert all(row["holm"] >= row["t"].p for row in rows)
    # a comparison enters the table once both groups are in at every seed: without balanced's seed 4, its two
    # comparisons leave the table and Holm's family shrinks from 9 tests to 3
    partial = [r for r in records if (r["arm"], r["seed"]) != ("memvir-balanced", 4)]
    rows = fair_study.comparisons(_results(tmp_path, partial), CPU)
    assert {(row["reference"], row["other"]) for row in rows} == {("baseline", "memvir-official")}
    raw = sorted(row["t"].p for row in rows)
    assert min(row["holm"] for row in rows) == pytest.approx(min(1.0, raw[0] * 3))


def test_two_controls_of_the_same_runs_are_one_row_and_one_test_of_holm_s_family(tmp_path):
    """The widened search's two step-schedule controls are one command (the baseline and balanced chose one
    optimiser): "balanced - schedule at balanced's optimiser" and "balanced - schedule at the baseline's" pair the
    same runs, so they are one row naming both, and Holm's family counts the test once."""
    labels = np.repeat(np.arange(10), 3).astype(np.int16)
    (tmp_path / "per_query").mkdir()
    records = []
    control = Setting(lr=7e-4, class_lr=2.9e-3, adam_eps=1e-4, scale=17.1, n=0, m=10, loss_scale_schedule=4)
    groups = (("final", "baseline", replace(control, m=50, loss_scale_schedule=0, loss_scale_after_warmup=2.0), 0.0),
              ("final", "memvir-balanced", replace(control, n=4, reduction="balanced", loss_scale_schedule=0), 0.01),
              ("control", "schedule-balanced-optimiser", control, 0.004),
              ("control", "schedule-baseline-optimiser", control, 0.004))
    for phase, arm, setting, shift in groups:
        for seed in range(10):
            name = f"per_query/{arm}-s{seed}.npz"
            values = np.full(30, 0.5 + shift, dtype=np.float32)
            np.savez(tmp_path / name, label=labels, recall_at_1=values > 0.5, map_at_r=values)
            noise = 0.001 * ((seed * 7 + len(arm)) % 5)
            metrics = {m: 0.5 + shift + noise for m in fair_study.METRICS}
            records.append({"profile": "wide", "phase": phase, "arm": arm, "seed": seed, "trial": None, "fold": None,
                            "setting": fair_study.asdict(setting), "metrics": metrics, "per_query": name})
    rows = fair_study.comparisons(_results(tmp_path, records), WIDE)
    pairs = [(row["reference"], row["other"]) for row in rows[::3]]
    # baseline - balanced, schedule - balanced (once), baseline - schedule; "the memory with seen labels" and the
    # paper's reduction are not in
    assert pairs == [("baseline", "memvir-balanced"), ("schedule-balanced-optimiser", "memvir-balanced"),
                     ("baseline", "schedule-baseline-optimiser")]
    assert rows[3]["also"] == [("schedule-baseline-optimiser", "memvir-balanced")]
    raw = sorted(row["t"].p for row in rows)
    assert len(rows) == 9 and min(row["holm"] for row in rows) == pytest.approx(min(1.0, raw[0] * 9))
    table = fair_study.comparison_table(rows)
    assert ("| MemVir, balanced reduction − baseline, balanced's step schedule and optimiser (the same runs as MemVir, "
            "balanced reduction − baseline, balanced's step schedule) | recall@1 |") in table


def test_over_ten_seeds_a_comparison_also_gives_its_difference_without_the_search_s_seed(tmp_path, monkeypatch):
    """Every search trial trained at seed 0: over ten seeds a row also gives the mean difference over seeds 1 to 9.
    MemVir leads by 5 MAP@R points at seed 0 and by 1 at the nine others: 1.4 over ten seeds, 1.0 without seed 0."""
    ten = replace(CPU, seeds=tuple(range(10)))
    labels = np.repeat(np.arange(10), 3).astype(np.int16)
    (tmp_path / "per_query").mkdir()
    records = []
    for arm in ("baseline", "memvir-official"):
        for seed in range(10):
            lead = (0.05 if seed == 0 else 0.01) if arm == "memvir-official" else 0.0
            values = np.full(30, 0.4 + lead + 0.002 * seed, dtype=np.float32)
            name = f"per_query/{arm}-s{seed}.npz"
            np.savez(tmp_path / name, label=labels, recall_at_1=values > 0.5, map_at_r=values)
            metrics = {"recall@1": 0.9, "r_precision": 0.5, "map@r": 0.4 + lead + 0.002 * seed}
            records.append({"profile": "cpu", "phase": "final", "arm": arm, "seed": seed, "trial": None,
                            "fold": None, "metrics": metrics, "per_query": name})
    rows = fair_study.comparisons(_results(tmp_path, records), ten)
    row = next(row for row in rows if row["metric"] == "map@r")
    assert row["t"].mean_diff == pytest.approx(1.4) and row["without_search_seed"] == pytest.approx(1.0)
    assert [seed for seed, _ in row["per_seed"]] == list(range(10))
    assert [difference for _, difference in row["per_seed"]] == pytest.approx([5.0] + [1.0] * 9)
    # its figure: one row a comparison, the seed-0 ring among the dots
    drawn = _keep_figures(monkeypatch)
    figure = fair_study.plot_seeds(rows, tmp_path / "seeds.png")
    assert figure is not None and _drawn(figure)
    # one comparison (MAP@R): the nine other seeds' dots at +1.0, seed 0's ring at +5.0
    dots, ring = (collection.get_offsets() for collection in drawn[-1].axes[0].collections)
    assert np.allclose(dots, [[1.0, 0.0]] * 9) and np.allclose(ring, [[5.0, 0.0]])
    assert fair_study.plot_seeds([r for r in rows if r["metric"] != "map@r"], tmp_path / "none.png") is None
    table = fair_study.comparison_table(rows).splitlines()
    assert "| difference | without seed 0 (the search's) |" in table[0]
    assert "| +1.40 | +1.00 |" in next(line for line in table if "| map@r |" in line)
    # five seeds: no such column (the first studies' tables stay as they were)
    rows = fair_study.comparisons(_results(tmp_path, [r for r in records if r["seed"] < 5]), CPU)
    assert "without seed 0" not in fair_study.comparison_table(rows)


def _drawn(path) -> bool:
    """A PNG with something drawn: more than a few colours over a good share of its pixels."""
    from PIL import Image

    pixels = np.asarray(Image.open(path).convert("L"))
    return (pixels < 250).mean() > 0.02 and len(np.unique(pixels)) > 20


def _keep_figures(monkeypatch) -> list:
    """The figures fair_study's plots close, kept to be read."""
    import matplotlib.pyplot as plt

    closed = []
    monkeypatch.setattr(plt, "close", closed.append)
    return closed


def test_the_search_figure_waits_for_every_arm_s_choice_and_the_doc_block_links_it(tmp_path, monkeypatch):
    scores = {arm: [0.5, 0.9, 0.5, 0.5, 0.5, 0.5] for arm in WIDE.arms[1:]}
    records = [record for arm, arm_scores in scores.items() for record in _scores(WIDE, arm, arm_scores)]
    baseline = [0.5, 0.6, 0.5, 0.5, 0.5, 0.5, 0.5, 0.7, 0.5, 0.5, 0.5, 0.5]  # trial 7: trial 1 with loss x2
    (tmp_path / "wide").mkdir()
    partial = _results(tmp_path / "wide", records + _scores(WIDE, "baseline", baseline[:-1]))
    assert fair_study.plot_search(partial, WIDE, tmp_path / "search.png") is None  # the baseline's last trial out
    assert fair_study.doc_figures(partial, WIDE, tmp_path / "doc.md", draw=False) == []
    results = _results(tmp_path / "wide", records + _scores(WIDE, "baseline", baseline))
    drawn = _keep_figures(monkeypatch)
    assert fair_study.plot_search(results, WIDE, tmp_path / "search.png") == tmp_path / "search.png"
    assert _drawn(tmp_path / "search.png")
    # the learning-rate panel: every trial of every arm at (its lr, its score), the baseline's choice (trial 7) ringed
    points = np.concatenate([c.get_offsets() for c in drawn[-1].axes[0].collections])
    expected = [(WIDE.trial(arm, t).lr, 100 * score) for arm, arm_scores in [("baseline", baseline), *scores.items()]
                for t, score in enumerate(arm_scores)]
    chosen = [(WIDE.trial("baseline", 7).lr, 70.0), *((WIDE.trial(arm, 1).lr, 90.0) for arm in scores)]
    assert sorted(map(tuple, points.round(9))) == sorted(map(tuple, np.round(expected + chosen, 9)))
    # every arm chose inside the box and no final is in: the search's figure alone, linked from the doc's folder
    assert fair_study.doc_figures(results, WIDE, tmp_path / "doc.md") == ["![wide-search](wide/wide-search.png)"]
    assert _drawn(tmp_path / "wide" / "wide-search.png")


def test_a_group_still_training_shows_its_seeds_so_far_and_no_spread_for_one_seed(tmp_path):
    """A final row of 1 seed of 5 is that seed's value, marked running, not 'value ± 0.00' (a spread it lacks)."""
    (tmp_path / "per_query").mkdir()
    records = []
    for arm, seeds in (("baseline", range(5)), ("memvir-official", [0])):
        for seed in seeds:
            name = f"per_query/{arm}-s{seed}.npz"
            np.savez(tmp_path / name, label=np.repeat(np.arange(4), 2).astype(np.int16),
                     recall_at_1=np.ones(8, bool), map_at_r=np.full(8, 0.5, np.float32))
            records.append({"profile": "cpu", "phase": "final", "arm": arm, "seed": seed, "trial": None, "fold": None,
                            "metrics": {"recall@1": 0.9 + 0.01 * seed, "r_precision": 0.6, "map@r": 0.5},
                            "per_query": name, "setting": {}, "adam_eps_share": None, "adam_eps_share_class": None})
    rows = {line.split(" | ")[0]: line.split(" | ") for line in
            fair_study.final_table(_results(tmp_path, records), CPU).splitlines()[2:]}
    baseline, official = rows["| baseline"], rows["| MemVir, paper's reduction"]
    # baseline: 5 seeds, Recall@1 90, 91, 92, 93, 94: mean 92.00, sample standard deviation sqrt(2.5) = 1.58
    assert baseline[2:4] == ["5", "92.00 ± 1.58"]
    assert official[2:5] == ["1 of 5, running", "90.00", "60.00"]


def test_the_report_rewrites_only_its_profile_s_block_of_a_document(tmp_path):
    (tmp_path / "results.json").write_text("[]")
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- cpu tables -->\nold tables\n<!-- /cpu tables -->\nafter\n")
    assert fair_study.update_doc(doc, CPU, tmp_path)
    # a profile with a search of its own: the search table alone until a final is in
    search = fair_study.search_table(Results(tmp_path / "results.json"), CPU)
    assert "| baseline | 0 |" in search
    assert doc.read_text() == f"before\n<!-- cpu tables -->\n{search}\n<!-- /cpu tables -->\nafter\n"
    assert not fair_study.update_doc(doc, PROFILES["schedule"], tmp_path)  # no block of its own: untouched
    assert doc.read_text().startswith("before\n<!-- cpu tables -->")


def test_the_step_schedule_controls_take_balanced_s_schedule_and_each_arm_s_optimiser(tmp_path):
    """Each control is its arm's chosen setting with one change: balanced's step schedule (the loss x (k+1) of its
    chosen N and M, no virtual row) at balanced's or at the baseline's optimiser; each MemVir arm's optimiser alone."""
    search = [_search_record(arm, t, f, 0.5 + 0.01 * t) for arm in CPU.arms for t in range(CPU.trials) for f in (0, 1)]
    schedule = PROFILES["schedule"]
    assert schedule.choose_from == "cpu" and schedule.study == CPU.study  # the CPU search's choices, trained again
    jobs = pending_jobs(_results(tmp_path, search), schedule)
    assert {job.arm for job in jobs if job.phase == "final"} == set(CPU.arms)  # again, on the schedule's commit
    chosen = {job.arm: job.setting for job in jobs if job.phase == "final" and job.seed == 0}
    controls = {job.arm: job.setting for job in jobs if job.phase == "control" and job.seed == 0}
    balanced, baseline, official = chosen["memvir-balanced"], chosen["baseline"], chosen["memvir-official"]
    assert controls["schedule-balanced-optimiser"] == replace(
        balanced, n=0, reduction="official", loss_scale_schedule=balanced.n)
    assert controls["schedule-baseline-optimiser"] == replace(
        baseline, m=balanced.m, loss_scale_schedule=balanced.n)
    assert controls["baseline-balanced-optimiser"] == replace(balanced, n=0, reduction="official")
    assert controls["baseline-official-optimiser"] == replace(
        baseline, lr=official.lr, class_lr=official.class_lr, adam_eps=official.adam_eps, scale=official.scale)
    args = controls["schedule-balanced-optimiser"].args(schedule)
    assert args[args.index("--loss-scale-schedule") + 1] == str(balanced.n) and "--memvir-reduction" not in args
    assert args[args.index("--memvir-n") + 1] == "0" and args[args.index("--memvir-m") + 1] == str(balanced.m)


def test_a_recorded_command_names_the_default_run_folder_not_where_this_machine_wrote_it(tmp_path):
    job = pending_jobs(_results(tmp_path, []), CPU)[0]
    args = job.args(CPU) + ["--out", "/somewhere/else/cpu/" + job.name, "--device", "cuda"]
    command = shown_command(args, job, CPU)
    assert command == "python " + " ".join(job.args(CPU)) + f" --out runs/fair/cpu/{job.name} --device cuda"


def _figures(results, profile, root) -> list[str]:
    """The image lines of a profile's block (fair_study.doc_figures), each of whose files is committed."""
    lines = fair_study.doc_figures(results, profile, root / "docs" / "reproduction.md", draw=False)
    for line in lines:
        assert (root / "docs" / line.split("(", 1)[1].rstrip(")")).is_file(), line
    return lines


def test_docs_reproduction_gives_the_report_s_tables_of_the_recorded_study():
    """Every figure of docs/reproduction.md's fair comparison is the report's, recomputed from results.json."""
    root = Path(__file__).resolve().parents[2]
    results = Results(root / "docs" / "reproduction" / "fair" / "results.json")
    doc = (root / "docs" / "reproduction.md").read_text()
    assert len(pending_jobs(results, CPU)) == 0, "the CPU study is complete"
    for table in (fair_study.search_table(results, CPU), fair_study.final_table(results, CPU),
                  fair_study.comparison_table(fair_study.comparisons(results, CPU))):
        assert table in doc


def test_docs_reproduction_gives_the_report_s_tables_of_the_step_schedule_study():
    """The step-schedule study's tables in docs/reproduction.md are the report's, recomputed from results.json, and
    every one of its runs trained on one of the two commits its protocol names (which differ only outside memvir/)."""
    root = Path(__file__).resolve().parents[2]
    results = Results(root / "docs" / "reproduction" / "fair" / "results.json")
    schedule = PROFILES["schedule"]
    doc = (root / "docs" / "reproduction.md").read_text()
    runs = [r for r in results.records if r["profile"] == schedule.name]
    assert runs and {r["commit"][:7] for r in runs} <= {"d906bc8", "88e59aa"}
    for table in (fair_study.final_table(results, schedule),
                  fair_study.comparison_table(fair_study.comparisons(results, schedule)),
                  *_figures(results, schedule, root)):
        assert table in doc


def test_docs_reproduction_gives_the_widened_search_s_tables_so_far_on_its_one_commit():
    """The widened search's block in docs/reproduction.md is the report's, recomputed from its results.json as runs
    finish (the search table, then the finals once any is in), and every run trained on the commit its protocol
    names."""
    root = Path(__file__).resolve().parents[2]
    wide = PROFILES["wide"]
    results = Results(root / "docs" / "reproduction" / "wide" / "results.json")
    assert {r["commit"][:7] for r in results.records} <= {"b94ea0d"}
    doc = (root / "docs" / "reproduction.md").read_text()
    block = doc.split("<!-- wide tables -->\n", 1)[1].split("\n<!-- /wide tables -->", 1)[0]
    tables = [fair_study.search_table(results, wide)]
    if results.find(profile="wide", phase="final"):
        tables += [fair_study.final_table(results, wide),
                   fair_study.comparison_table(fair_study.comparisons(results, wide))]
    assert block == "\n\n".join(tables + _figures(results, wide, root))
    # once every arm has chosen, the words after the block give each choice's validation MAP@R as the table does
    searches = {arm: fair_study.arm_search(results, wide, arm) for arm in wide.arms}
    if all(search.chosen for search in searches.values()):
        words = doc.split("<!-- /wide tables -->\n", 1)[1].split("\n## ", 1)[0]
        for arm, search in searches.items():
            score = fair_study.search_score(results, wide, arm, search.trials.index(search.chosen))
            assert f"{100 * score:.2f}" in words, arm
            assert not search.edges, f"{arm} chose on its box's edge"


@pytest.mark.parametrize("name", ["dilution-10", "dilution-30"])
def test_docs_reproduction_gives_the_dilution_control_s_tables_on_its_one_commit(name):
    """The regime's dilution control's block in docs/reproduction.md is the report's, recomputed from the regime's
    results.json (the finals, the comparisons and the early-stop table, once any run is in), and every run of it
    trained on the commit its protocol names."""
    root = Path(__file__).resolve().parents[2]
    profile = PROFILES[name]
    results = Results(root / "docs" / "reproduction" / "regime" / "results.json")
    records = [r for r in results.records if r["profile"] == name]
    assert {r["commit"][:7] for r in records} <= {"b94ea0d"}
    doc = (root / "docs" / "reproduction.md").read_text()
    block = doc.split(f"<!-- {name} tables -->\n", 1)[1].split(f"<!-- /{name} tables -->", 1)[0]
    if not records:
        assert block == ""
        return
    tables = [fair_study.final_table(results, profile),
              fair_study.comparison_table(fair_study.comparisons(results, profile)),
              fair_study.early_stop_table(results, (name,)), *_figures(results, profile, root)]
    assert block == "\n\n".join(tables) + "\n"


def test_the_page_s_regime_note_gives_the_dilution_control_s_figures():
    """demo.train.words.REGIME_NOTE's few-class sentence, recomputed from the dilution control's runs: official
    MemVir's MAP@R lead over the baseline at its optimiser (the range it quotes), a larger lead over the halved
    baseline, each a gain after Holm, and every run of it ending below the backbone's MAP@R at step 0."""
    import fair_stats

    from demo.train import words

    root = Path(__file__).resolve().parents[2]
    results = Results(root / "docs" / "reproduction" / "regime" / "results.json")
    leads = {}
    for name in ("dilution-10", "dilution-30"):
        profile = PROFILES[name]
        assert not pending_jobs(results, profile), f"{name} is complete"
        rows = {row["reference"]: row for row in fair_study.comparisons(results, profile)
                if row["metric"] == "map@r" and row["other"] == "memvir-official"}
        plain, halved = rows["baseline-memvir-optimiser"], rows["baseline-memvir-optimiser-half"]
        assert all(fair_stats.verdict(row["t"].mean_diff, row["holm"]) == "gain" for row in (plain, halved))
        assert halved["t"].mean_diff > plain["t"].mean_diff
        leads[name] = plain["t"].mean_diff
        for record in results.records:
            if record["profile"] == name:
                assert record["curve"][0][0] == 0  # its first evaluation: the backbone, before any step
                assert record["metrics"]["map@r"] < record["curve"][0][record["curve_columns"].index("map@r")]
    low, high = sorted(leads.values())
    assert f"by {low:.1f} to {high:.1f} points of MAP@R over ten seeds" in words.REGIME_NOTE
    assert "by more when the baseline's loss was halved" in words.REGIME_NOTE
    assert "every run ended below the pretrained backbone" in words.REGIME_NOTE


REGIME = PROFILES["regime"]


def test_the_regime_fine_tunes_the_bundled_backbone_and_its_search_runs_draw_validation_curves(tmp_path):
    search_job = pending_jobs(_results(tmp_path, []), REGIME)[0]
    args = search_job.args(REGIME)
    assert args[args.index("--dataset") + 1] == "glyphs-few"
    assert args[args.index("--init") + 1] == "checkpoints/glyphs-pretrain-convnet"
    assert (Path(__file__).resolve().parents[2] / "checkpoints" / "glyphs-pretrain-convnet" / "config.json").is_file()
    assert args[-6:] == ["--val-classes", "38", "--val-fold", "0", "--eval-every", "10"]
    assert "--init" not in pending_jobs(_results(tmp_path, []), CPU)[0].args(CPU)  # the glyphs study: from scratch


def test_a_class_share_profile_trains_the_regime_s_choices_on_that_share_of_the_classes(tmp_path):
    share = PROFILES["regime-30"]
    assert share.study == REGIME.study  # one results.json: the choice is read from the regime's search
    assert pending_jobs(_results(tmp_path, []), share) == []  # no search of its own, nothing before the regime's
    search = [{**_search_record(arm, t, f, 0.5 + 0.01 * t * (arm == "memvir-official")), "profile": "regime"}
              for arm in CPU.arms for t in range(REGIME.trials) for f in (0, 1)]
    jobs = pending_jobs(_results(tmp_path, search), share)
    finals = [job for job in jobs if job.phase == "final"]
    assert len(finals) == len(share.arms) * len(share.seeds)
    official = next(job for job in jobs if job.arm == "memvir-official")
    assert official.setting == trial_setting("memvir-official", REGIME.trials - 1, REGIME.trials)
    # its one control: the baseline with the MemVir arm's chosen optimiser (the arms' choices differ in it)
    controls = [job for job in jobs if job.phase == "control"]
    assert {job.arm for job in controls} == {"baseline-memvir-optimiser"} and len(controls) == len(share.seeds)
    assert controls[0].setting == replace(official.setting, n=0)
    seventy = pending_jobs(_results(tmp_path, search), PROFILES["regime-70"])
    assert not [job for job in seventy if job.phase == "control"]
    args = official.args(share)
    # 30 % of glyphs-few's 116 classes trained (35), the other 81 held out and scored as validation
    assert args[args.index("--val-classes") + 1] == "81" and args[args.index("--val-fold") + 1] == "0"
    assert PROFILES["regime-10"].held_out == 116 - 12 and PROFILES["regime-70"].held_out == 116 - 81


def test_the_dilution_control_halves_the_baseline_s_loss_at_official_s_optimiser_beside_official_at_ten_seeds(
        tmp_path):
    search = [{**_search_record(arm, t, f, 0.5 + 0.01 * t * (arm == "memvir-official")), "profile": "regime"}
              for arm in CPU.arms for t in range(REGIME.trials) for f in (0, 1)]
    for share, held_out in (("dilution-10", 104), ("dilution-30", 81)):
        profile = PROFILES[share]
        assert profile.study == REGIME.study and profile.held_out == held_out and profile.seeds == tuple(range(10))
        jobs = pending_jobs(_results(tmp_path, search), profile)
        official = trial_setting("memvir-official", REGIME.trials - 1, REGIME.trials)
        runs = {(job.phase, job.arm): job.setting for job in jobs}
        assert sorted(runs) == [("control", "baseline-memvir-optimiser"), ("control", "baseline-memvir-optimiser-half"),
                                ("final", "memvir-official")]  # only official's final again, beside its controls
        assert runs["control", "baseline-memvir-optimiser-half"] == replace(official, n=0, loss_scale_after_warmup=0.5)
        assert len(jobs) == 3 * 10
        args = runs["control", "baseline-memvir-optimiser-half"].args(profile)
        assert args[args.index("--loss-scale-after-warmup") + 1] == "0.5" and args[args.index("--memvir-n") + 1] == "0"


def test_the_early_stop_table_reads_each_run_s_best_validation_evaluation(tmp_path):
    def final(arm, seed, curve):
        return {"profile": "regime-70", "phase": "final", "arm": arm, "seed": seed, "trial": None, "fold": None,
                "curve_columns": ["step", "map@r", "val_map@r"], "curve": [list(row) for row in curve],
                "metrics": {"map@r": curve[-1][1]}}

    records = [final("baseline", 0, [(0, 0.80, 0.90), (100, 0.84, 0.93), (200, 0.86, 0.93)]),  # the first of equals
               final("baseline", 1, [(0, 0.80, 0.95), (100, 0.82, 0.94), (200, 0.83, 0.91)])]
    table = fair_study.early_stop_table(_results(tmp_path, records), ("regime-70", "regime"))
    # backbone 80.00; final (86 + 83) / 2 = 84.50; stops at step 100 (84) and step 0 (80): 82.00
    assert table.splitlines()[2] == "| 81 of 116 | baseline | 2 | 80.00 | 84.50 | 82.00 | 100, 0 |"
    assert len(table.splitlines()) == 3  # the whole regime holds no class out: no validation, no row


def test_a_run_s_record_keeps_its_curves_and_its_target_cosines(tmp_path):
    steps = [{"type": "step", "step": s, "warmup": s < 20, "mean_target_cosine": c}
             for s, c in ((10, 0.41234567), (20, 0.6), (30, 0.75))]
    evals = [{"type": "eval", "step": s, "recall@1": 0.9, "r_precision": 0.5, "map@r": m, "val_map@r": v,
              "val_recall@1": 0.9, "val_r_precision": 0.6} for s, m, v in ((0, 0.4, 0.7), (30, 0.45, 0.65))]
    run = _run_folder(tmp_path / "run", [*steps, *evals])
    searched = fair_study.read_run(run, test=False)
    assert searched["curve_columns"] == ["step", "val_recall@1", "val_r_precision", "val_map@r"]
    assert searched["curve"] == [[0, 0.9, 0.6, 0.7], [30, 0.9, 0.6, 0.65]]  # no test metric in a search's curve
    assert searched["target_cosine"] == [[10, 0.4123], [20, 0.6], [30, 0.75]]
    assert fair_study.read_run(run, test=False, curves=False)["curve"] == []


def test_the_over_fitting_table_reads_each_arm_s_mean_test_curve_its_best_and_its_end(tmp_path):
    def final(arm, seed, curve, cosine):
        return {"profile": "regime", "phase": "final", "arm": arm, "seed": seed, "trial": None, "fold": None,
                "curve_columns": ["step", "recall@1", "map@r"], "curve": [[s, 0.9, m] for s, m in curve],
                "target_cosine": [[1, 0.1], [200, cosine]]}

    records = [final("baseline", 0, [(0, 0.80), (100, 0.86), (200, 0.84)], 0.80),
               final("baseline", 1, [(0, 0.80), (100, 0.84), (200, 0.83)], 0.90),
               final("memvir-official", 0, [(0, 0.80), (100, 0.82), (200, 0.85)], 0.60)]
    table = fair_study.overfit_table(_results(tmp_path, records), REGIME)
    # baseline: means 80, 85, 83.5 -> best 85 at step 100, the end 1.5 below it; cos at the end (0.8 + 0.9) / 2
    assert "| baseline | 2 | 80.00 | 85.00 (100) | 83.50 | -1.50 | 0.850 |" in table
    assert "| MemVir, paper's reduction | 1 | 80.00 | 85.00 (200) | 85.00 | +0.00 | 0.600 |" in table
    assert "balanced" not in table  # no finals yet


def test_the_page_offers_the_paper_s_regime_if_and_only_if_its_study_found_memvir_ahead():
    """The rule fixed in docs/reproduction.md before the finals: a preset for the regime iff a MemVir arm beats the
    baseline on test MAP@R with Holm p < 0.05; otherwise the page says that it is not offered, and why."""
    from demo.train import words
    from demo.train.presets import PRESETS

    root = Path(__file__).resolve().parents[2]
    results = Results(root / "docs" / "reproduction" / "regime" / "results.json")
    assert not [job for job in pending_jobs(results, REGIME) if job.phase in ("search", "final")]
    rows = fair_study.comparisons(results, REGIME)
    ahead = [row for row in rows if row["reference"] == "baseline" and row["metric"] == "map@r"
             and fair_stats_verdict(row) == "gain"]
    offered = any(preset.settings().get("dataset") == "glyphs-few" for preset in PRESETS.values()) or \
        "glyphs-few" in PRESETS
    assert offered == bool(ahead)
    if not ahead:
        assert "is not offered" in words.REGIME_NOTE
        assert "MemVir changed no test metric measurably" in words.REGIME_NOTE
        # and no MemVir - baseline row of the regime's table is a gain in any metric
        assert all(fair_stats_verdict(row) != "gain" for row in rows if row["reference"] == "baseline")


def fair_stats_verdict(row) -> str:
    import fair_stats

    return fair_stats.verdict(row["t"].mean_diff, row["holm"])


def test_docs_reproduction_gives_the_regime_report_s_tables():
    """Every table of docs/reproduction.md's section 10 is the report's, recomputed from its results.json."""
    root = Path(__file__).resolve().parents[2]
    results = Results(root / "docs" / "reproduction" / "regime" / "results.json")
    doc = (root / "docs" / "reproduction.md").read_text()
    assert len(pending_jobs(results, REGIME)) == 0, "the regime's search and finals are complete"
    for table in (fair_study.search_table(results, REGIME), fair_study.final_table(results, REGIME),
                  fair_study.comparison_table(fair_study.comparisons(results, REGIME)),
                  fair_study.overfit_table(results, REGIME),
                  fair_study.share_table(results, fair_study.REGIME_SHARES),
                  fair_study.early_stop_table(results, fair_study.REGIME_SHARES)):
        assert table in doc
    for share in ("regime-10", "regime-30", "regime-70"):
        assert len(pending_jobs(results, PROFILES[share])) == 0, f"{share} is complete"
