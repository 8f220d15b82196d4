"""The Trainer on glyphs-mini: it learns, resumes exactly, obeys live control, and fails safely."""

import json
import threading

import pytest
import torch

from memvir import TrainConfig, Trainer
from memvir.data.transforms import sample_seed
from memvir.events import ControlEvent, EvalEvent, SnapshotEvent, StatusEvent, StepEvent
from memvir.models.embedding_model import EmbeddingModel
from memvir.train.checks import TrainingDiverged


def small_config(**overrides):
    values = dict(dataset="glyphs-mini", batch_size=32, epochs=2, memvir_n=2, memvir_m=1, warmup_epochs=0.5,
                  snapshot_every=0, eval_every=0, eval_at_start=False, log_every=1, checkpoint_every=1000)
    values.update(overrides)
    return TrainConfig(**values)


def collect(trainer):
    events = []
    trainer.add_listener(events.append)
    return events


def test_config_json_round_trip_and_unknown_keys():
    config = small_config(loss="cosface", loss_params={"margin": 0.2})
    assert TrainConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match="unknown setting"):
        TrainConfig.from_dict({**config.to_dict(), "colour": "red"})


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"memvir_n": -1}, "memvir_n must be an integer >= 0"),
        ({"memvir_m": -3}, "memvir_m"),
        ({"warmup_epochs": -1}, "warmup_epochs"),
        ({"loss": "triplet"}, "unknown loss 'triplet'"),
        ({"loss_params": {"scale": -1}}, "scale"),
        ({"lr": 0}, "lr must be > 0"),
        ({"batch_size": 0}, "batch_size"),
        ({"sampler": "weird"}, "sampler"),
        ({"sampler": "balanced", "batch_size": 30, "samples_per_class": 4}, "multiple of samples_per_class"),
        ({"memvir_store_dtype": "int8"}, "memvir_store_dtype"),
        ({"memvir_schedule": "sudden"}, "memvir_schedule must be one of curriculum, all-at-once"),
        ({"val_classes": -2}, "val_classes must be an integer >= 0"),
        ({"val_classes": 23}, "cannot hold out 23 validation classes from the 24 training classes"),
    ],
)
def test_bad_config_values_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        Trainer(small_config(**overrides))


def test_bad_dataset_and_batch_size_are_rejected_with_advice():
    with pytest.raises(ValueError, match="unknown dataset"):
        Trainer(small_config(dataset="imagenet-22k"))
    with pytest.raises(ValueError, match="larger than the training split"):
        Trainer(small_config(batch_size=100_000))


def test_steps_follow_the_class_count_staircase():
    trainer = Trainer(small_config(epochs=3, warmup_epochs=1, memvir_n=2, memvir_m=1))
    events = collect(trainer)
    trainer.run()
    steps = [e for e in events if isinstance(e, StepEvent)]
    c, u, m, n = trainer.data.info.num_train_classes, trainer.steps_per_epoch, 1, 2
    assert len(steps) == 3 * trainer.steps_per_epoch
    for event in steps:
        i = event.step - 1  # the call index of this step
        expected = c if i < u else c * (min((i - u) // (m + 1), n) + 1)
        assert event.num_classes == expected, event
        assert event.warmup == (i < u)
        assert -1.0 <= event.mean_target_cosine <= 1.0 and event.images_per_s > 0


@pytest.mark.slow
def test_training_improves_retrieval_on_unseen_classes():
    trainer = Trainer(small_config(epochs=8, eval_at_start=True, eval_every=8))
    events = collect(trainer)
    assert trainer.run() == "finished"
    evals = [e for e in events if isinstance(e, EvalEvent)]
    assert [e.step for e in evals] == [0, trainer.total_steps]
    before, after = evals[0].metrics, evals[-1].metrics
    # glyphs-mini's Recall@1 is high even untrained (twelve clean faces per class); MAP@R shows the learning best
    assert after["recall@1"] > before["recall@1"] + 0.02
    assert after["map@r"] > before["map@r"] + 0.1
    assert trainer.step == 8 * trainer.steps_per_epoch


def test_run_folder_holds_hub_files_metrics_and_state(tmp_path):
    trainer = Trainer(small_config(epochs=1, eval_every=1, log_every=2), tmp_path)
    trainer.run()
    for name in ("config.json", "model.safetensors", "README.md", "metrics.jsonl", "trainer_state.pt",
                 "train_config.json"):
        assert (tmp_path / name).is_file(), name
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step_records = [r for r in records if r["type"] == "step"]
    # step 1, every second step, and the last one (glyphs-mini's epoch at batch 32 is 9 steps)
    assert trainer.total_steps == 9
    assert [r["step"] for r in step_records] == [1, 2, 4, 6, 8, 9]
    assert any(r["type"] == "eval" and "map@r" in r for r in records)
    assert "recall@1" in (tmp_path / "README.md").read_text().lower()
    loaded = EmbeddingModel.from_pretrained(tmp_path)
    images = torch.stack([trainer.data.test[i][0] for i in range(6)])
    trainer.model.eval()
    with torch.no_grad():
        assert torch.equal(loaded.embed(images), trainer.model(images))
    assert loaded.config["dataset"] == "glyphs-mini" and loaded.config["in_channels"] == 1


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    config = small_config(epochs=3, warmup_epochs=0.5, memvir_n=2, memvir_m=1, log_every=5)
    straight = Trainer(config, tmp_path / "straight")
    straight.run()

    stop_at = straight.steps_per_epoch + 3  # mid-epoch, mid-curriculum
    first = Trainer(config, tmp_path / "interrupted")
    first.add_listener(lambda e: first.stop() if isinstance(e, StepEvent) and e.step == stop_at else None)
    assert first.run() == "stopped" and first.step == stop_at
    assert first.memvir.num_stored > 0

    resumed = Trainer.from_run_folder(tmp_path / "interrupted")
    assert resumed.step == stop_at
    assert resumed.run() == "finished"
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert torch.equal(straight.class_weights, resumed.class_weights)
    assert straight.memvir.step == resumed.memvir.step
    assert torch.equal(straight.memvir.state_dict()["_extra_state"]["embeddings"],
                       resumed.memvir.state_dict()["_extra_state"]["embeddings"])
    step_lines = [line for line in (tmp_path / "interrupted" / "metrics.jsonl").read_text().splitlines()
                  if '"type": "step"' in line]
    straight_lines = [line for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()
                      if '"type": "step"' in line]
    assert [json.loads(x)["loss"] for x in step_lines] == [json.loads(x)["loss"] for x in straight_lines]


def test_resume_can_extend_epochs_but_not_change_the_model(tmp_path):
    Trainer(small_config(epochs=1), tmp_path).run()
    longer = Trainer.from_run_folder(tmp_path, epochs=2)
    assert longer.total_steps == 2 * longer.steps_per_epoch and longer.step == longer.steps_per_epoch
    with pytest.raises(ValueError, match="cannot change embedding_dim"):
        Trainer.from_run_folder(tmp_path, embedding_dim=64)


def test_resume_without_a_checkpoint_says_so(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint"):
        Trainer.from_run_folder(tmp_path / "nothing-here")
    (tmp_path / "trainer_state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot read the checkpoint"):
        Trainer.from_run_folder(tmp_path)


def test_live_update_applies_at_the_next_step():
    trainer = Trainer(small_config(epochs=2, memvir_n=2, memvir_m=1, warmup_epochs=0))
    events = collect(trainer)
    trainer.add_listener(lambda e: trainer.update(memvir_n=1, memvir_m=0) if isinstance(e, StepEvent)
                         and e.step == 4 else None)
    trainer.run()
    controls = [e for e in events if isinstance(e, ControlEvent)]
    assert len(controls) == 1 and controls[0].step == 4
    assert "memvir_n 2 -> 1" in controls[0].message and "applied at step 5" in controls[0].message
    # the values replaced travel as data, in the event and in metrics.jsonl's record: a run's story reads from them
    assert controls[0].changes == {"memvir_n": 1, "memvir_m": 0}
    assert controls[0].previous == {"memvir_n": 2, "memvir_m": 1}
    record = next(r for r in trainer.history if r["type"] == "control")
    assert record["previous"] == {"memvir_n": 2, "memvir_m": 1} and record["memvir_n"] == 1
    assert trainer.memvir.num_steps == 1 and trainer.memvir.margin == 0 and trainer.config.memvir_n == 1
    steps = {e.step: e for e in events if isinstance(e, StepEvent)}
    assert steps[4].num_virtual_sets == 1  # N=2, M=1 after 3 stored steps: one set
    assert all(steps[s].num_virtual_sets == 1 for s in range(5, trainer.total_steps + 1))  # N=1 from step 5 on
    with pytest.raises(ValueError, match="memvir_n"):
        trainer.update(memvir_n=-2)


def test_a_live_changed_runs_model_card_says_what_it_started_with_and_each_change_at_its_step(tmp_path):
    """Before, the card said 'N=1, M=0' as if those had held throughout a run that started at N = 2, M = 1."""
    trainer = Trainer(small_config(epochs=1, memvir_n=2, memvir_m=1, warmup_epochs=0), tmp_path)
    trainer.add_listener(lambda e: trainer.update(memvir_n=1, memvir_m=0) if isinstance(e, StepEvent)
                         and e.step == 4 else None)
    trainer.run()
    card = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "| MemVir | N=2, M=1, warm-up 0 epochs (0 steps), official reduction |" in card
    assert "| Live changes | memvir_n 2 -> 1 at step 5, memvir_m 1 -> 0 at step 5 |" in card


def test_pause_and_resume_from_another_thread():
    trainer = Trainer(small_config(epochs=1))
    events = collect(trainer)
    paused = threading.Event()

    def on_event(event):
        if isinstance(event, StepEvent) and event.step == 2:
            trainer.pause()
        if isinstance(event, StatusEvent) and event.state == "paused":
            paused.set()

    trainer.add_listener(on_event)
    thread = threading.Thread(target=trainer.run)
    thread.start()
    assert paused.wait(60)
    step_while_paused = trainer.step
    assert trainer.state == "paused"
    trainer.resume_training()
    thread.join(120)
    assert not thread.is_alive() and trainer.state == "finished" and step_while_paused == 2
    assert [e.state for e in events if isinstance(e, StatusEvent)] == ["running", "paused", "running", "finished"]


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    trainer = Trainer(small_config(epochs=2), tmp_path)
    events = collect(trainer)
    trainer.add_listener(lambda e: trainer.save_checkpoint() if isinstance(e, StepEvent) and e.step == 3 else None)
    original = trainer.loss_fn.forward

    def poisoned(embeddings, labels, weights):
        loss = original(embeddings, labels, weights)
        return loss * float("nan") if trainer.step >= 5 else loss

    trainer.loss_fn.forward = poisoned
    with pytest.raises(TrainingDiverged, match="the loss became nan at step 6"):
        trainer.run()
    assert trainer.state == "failed"
    assert any(isinstance(e, StatusEvent) and e.state == "failed" for e in events)
    resumed = Trainer.from_run_folder(tmp_path)
    assert resumed.step == 3  # the last good checkpoint, untouched by the failure
    assert all(torch.isfinite(p).all() for p in resumed.model.parameters())


def test_snapshots_tag_memory_rows_with_their_age():
    trainer = Trainer(small_config(epochs=2, warmup_epochs=0, memvir_n=2, memvir_m=1, snapshot_every=6,
                                   probe_classes=3))
    events = collect(trainer)
    trainer.run()
    snapshots = [e for e in events if isinstance(e, SnapshotEvent)]
    assert [s.step for s in snapshots] == list(range(6, trainer.total_steps + 1, 6))
    last = snapshots[-1]
    c, b = trainer.data.info.num_train_classes, trainer.config.batch_size
    assert torch.equal(last.ages, torch.arange(3).repeat_interleave(b))
    assert last.class_weights.shape[0] == 3 * c
    assert torch.equal(last.class_weight_ages, torch.arange(3).repeat_interleave(c))
    assert torch.equal(last.class_weight_labels, torch.arange(c).repeat(3))
    assert int(last.labels.max()) < c
    assert last.probe_labels.unique().numel() == 3 and last.probe_embeddings.shape[1] == trainer.config.embedding_dim


def test_sample_seed_fixes_the_augmentation_of_a_sample():
    trainer = Trainer(small_config())
    dataset = trainer.data.train
    with sample_seed(123):
        first = dataset[5][0]
    dataset[7], dataset[9]  # draws in between do not matter
    with sample_seed(123):
        again = dataset[5][0]
    with sample_seed(124):
        other = dataset[5][0]
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_balanced_sampler_batches_hold_p_classes_of_k():
    trainer = Trainer(small_config(sampler="balanced", batch_size=32, samples_per_class=4))
    batch_labels = next(iter(trainer.batches.epoch(0, 0)))[1]
    counts = torch.bincount(batch_labels)
    assert sorted(counts[counts > 0].tolist()) == [4] * 8


def test_all_at_once_schedule_brings_every_virtual_set_at_the_warmup_end():
    """glyphs-mini: 24 classes x 12 faces / batch 32 = 9 steps an epoch; warm-up 1 epoch = 9 steps; N=2, M=1.
    The curriculum adds a set every 2 steps after step 9; all-at-once stores steps 5-8 and uses both sets at once."""
    counts = {}
    for schedule in ("curriculum", "all-at-once"):
        trainer = Trainer(small_config(memvir_schedule=schedule, warmup_epochs=1, max_steps=14))
        events = collect(trainer)
        trainer.run()
        counts[schedule] = [e.num_classes for e in events if isinstance(e, StepEvent)]
    assert counts["curriculum"] == [24] * 9 + [24, 24, 48, 48, 72]
    assert counts["all-at-once"] == [24] * 9 + [72] * 5


# ---------------------------------------------------------------------------------------------------------------
# Ablation options: the balanced reduction, a loss scaled after the warm-up, frozen BatchNorm
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"memvir_reduction": "median"}, "memvir_reduction must be one of official, balanced"),
        ({"loss_scale_after_warmup": 0}, "loss_scale_after_warmup must be > 0"),
        ({"loss_scale_after_warmup": float("inf")}, "loss_scale_after_warmup must be > 0 and finite"),
        ({"freeze_bn": "yes"}, "freeze_bn must be True or False"),
    ],
)
def test_bad_ablation_settings_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        small_config(**overrides).validate()


def step_losses(config):
    trainer = Trainer(config)
    events = collect(trainer)
    trainer.run()
    return trainer, [e for e in events if isinstance(e, StepEvent)]


def test_balanced_reduction_sums_the_set_means_in_training():
    """N=1, M=0, no warm-up: step 1 has no virtual set (both reductions agree), step 2 has one set of the previous
    batch, of the same size as the live one, so the sum of the two set means is twice the mean over all rows."""
    config = dict(memvir_n=1, memvir_m=0, warmup_epochs=0, max_steps=2)
    _, official = step_losses(small_config(**config))
    _, balanced = step_losses(small_config(memvir_reduction="balanced", **config))
    assert [e.num_virtual_sets for e in balanced] == [0, 1]
    assert balanced[0].loss == pytest.approx(official[0].loss, rel=1e-6)  # the same mean, summed another way
    assert balanced[1].loss == pytest.approx(2 * official[1].loss, rel=1e-5)


def test_loss_scale_after_warmup_scales_the_gradient_from_the_warmup_end():
    """A baseline whose loss is halved once its warm-up (here 2 steps) is over: the same steps until then, and at
    the first step after it the same loss with exactly half the gradient."""
    config = dict(memvir_n=0, warmup_epochs=2 / 9)  # glyphs-mini at batch 32: 9 steps an epoch, so U = 2 steps
    for steps, factor in ((2, 1.0), (3, 0.5)):
        plain, plain_steps = step_losses(small_config(max_steps=steps, **config))
        halved, halved_steps = step_losses(small_config(max_steps=steps, loss_scale_after_warmup=0.5, **config))
        assert halved.memvir.warmup_steps == 2
        assert [e.loss for e in halved_steps] == [e.loss for e in plain_steps]  # the logged loss is the unscaled one
        torch.testing.assert_close(halved.class_weights.grad, factor * plain.class_weights.grad)
        first_conv = next(p for p in halved.model.parameters() if p.dim() == 4)
        plain_conv = next(p for p in plain.model.parameters() if p.dim() == 4)
        torch.testing.assert_close(first_conv.grad, factor * plain_conv.grad)


def test_loss_scale_schedule_is_balanced_memvirs_step_schedule_without_virtual_rows():
    """The step-schedule control: a baseline whose loss is multiplied by k(t)+1, k(t) the virtual sets balanced
    MemVir(N, M) uses at step t. By hand for N=2, M=1, U=2 steps: k = 0 until step index 4 (two steps stored), 1 for
    two steps, then 2. It equals the balanced MemVir run's own k at every step, and the gradient is scaled by it."""
    config = dict(warmup_epochs=2 / 9, memvir_m=1, max_steps=12)  # glyphs-mini at batch 32: 9 steps an epoch, U = 2
    by_hand = [1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 3]
    control, control_steps = step_losses(small_config(memvir_n=0, loss_scale_schedule=2, **config))
    _, memvir_steps = step_losses(small_config(memvir_n=2, memvir_reduction="balanced", **config))
    assert [e.loss_scale for e in control_steps] == by_hand
    assert [e.num_virtual_sets + 1 for e in memvir_steps] == by_hand
    assert all(e.num_virtual_sets == 0 for e in control_steps)  # no virtual row enters the control's loss
    records = [r for r in control.history if r["type"] == "step"]
    assert [r["loss_scale"] for r in records] == by_hand  # in metrics.jsonl too
    # Until step index 4 the two runs are one run; at it, the same loss from the same parameters with twice the
    # gradient (every gradient: the class weights' and the network's)
    for steps, factor in ((4, 1.0), (5, 2.0)):
        plain, plain_steps = step_losses(small_config(memvir_n=0, **{**config, "max_steps": steps}))
        scaled, scaled_steps = step_losses(small_config(memvir_n=0, loss_scale_schedule=2,
                                                        **{**config, "max_steps": steps}))
        assert [e.loss for e in scaled_steps] == [e.loss for e in plain_steps]  # the logged loss is the unscaled one
        torch.testing.assert_close(scaled.class_weights.grad, factor * plain.class_weights.grad)
        first_conv = next(p for p in scaled.model.parameters() if p.dim() == 4)
        plain_conv = next(p for p in plain.model.parameters() if p.dim() == 4)
        torch.testing.assert_close(first_conv.grad, factor * plain_conv.grad)


@pytest.mark.parametrize("overrides,message", [
    ({"memvir_n": 2, "loss_scale_schedule": 2}, "loss_scale_schedule 2 is the baseline's control"),
    ({"memvir_n": 0, "loss_scale_schedule": 2, "memvir_schedule": "all-at-once"}, "follows the curriculum"),
    ({"memvir_n": 0, "loss_scale_schedule": -1}, "loss_scale_schedule must be an integer >= 0"),
])
def test_loss_scale_schedule_refuses_what_it_cannot_mean(overrides, message):
    with pytest.raises(ValueError, match=message):
        small_config(**overrides)


def test_freeze_bn_keeps_batchnorm_statistics_while_the_rest_trains():
    """As the reference's --freeze_BN: BatchNorm layers run in eval mode (their running statistics stay as they
    were), while every parameter, the BatchNorm scales and shifts included, still trains."""
    def running_statistics(trainer):
        return {k: v.clone() for k, v in trainer.model.state_dict().items()
                if any(part in k for part in ("running_mean", "running_var", "num_batches_tracked"))}

    frozen = Trainer(small_config(freeze_bn=True, max_steps=3))
    norms = [m for m in frozen.model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms, "the convnet has BatchNorm layers to freeze"
    before = running_statistics(frozen)
    affine_before = [p.clone() for m in norms for p in m.parameters()]
    frozen.run()
    for key, value in running_statistics(frozen).items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)
    assert all(not torch.equal(after, original) for after, original
               in zip([p for m in norms for p in m.parameters()], affine_before, strict=True))
    assert all(m.training for m in frozen.model.modules() if not isinstance(m, torch.nn.BatchNorm2d))

    free = Trainer(small_config(max_steps=3))
    free_before = running_statistics(free)
    free.run()
    assert any(not torch.equal(v, free_before[k]) for k, v in running_statistics(free).items())


def test_step_decay_drops_the_learning_rates_at_the_start_of_the_given_epochs():
    """glyphs-mini at batch 32 takes 9 steps an epoch; x0.1 at the start of epochs 2 and 3 (1-based), as the
    reference's adjust_learning_rate: the steps of epoch 1 at 1e-3 / 1e-2, of epoch 2 at a tenth, of 3 at a
    hundredth."""
    trainer = Trainer(small_config(epochs=3, lr=1e-3, class_lr=1e-2, lr_decay="step", lr_decay_epochs=[2, 3],
                                   lr_decay_rate=0.1))
    assert trainer.steps_per_epoch == 9
    used = [(trainer.optimizer.param_groups[0]["lr"], trainer.optimizer.param_groups[1]["lr"])]  # for step 1
    trainer.add_listener(lambda e: used.append((trainer.optimizer.param_groups[0]["lr"],
                                                trainer.optimizer.param_groups[1]["lr"]))
                         if isinstance(e, StepEvent) else None)
    trainer.run()
    used = used[:27]  # the rates set for steps 1..27
    expected = [(1e-3 * 0.1 ** (s // 9), 1e-2 * 0.1 ** (s // 9)) for s in range(27)]
    for (lr, class_lr), (want_lr, want_class_lr) in zip(used, expected, strict=True):
        assert lr == pytest.approx(want_lr) and class_lr == pytest.approx(want_class_lr)
    with pytest.raises(ValueError, match="lr_decay 'step' needs lr_decay_epochs"):
        small_config(lr_decay="step").validate()


def test_spread_measures_reach_the_step_records_at_the_snapshot_cadence(tmp_path):
    """Every 4th step (the snapshot cadence) the record carries the spread of the classes; once a virtual set is in
    use (M=1: from step 3 after a 1-step warm-up... here warm-up 0), its ages' figures, checked by hand against
    the snapshot of the same step."""
    trainer = Trainer(small_config(memvir_n=2, memvir_m=1, warmup_epochs=0, snapshot_every=4, log_every=3,
                                   max_steps=8, probe_classes=2), tmp_path)
    events = collect(trainer)
    trainer.run()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in records if r["type"] == "step"}
    assert sorted(steps) == [1, 3, 4, 6, 8]  # log_every 3 (and the first and last), spread every 4
    assert "weight_mean_cos" not in steps[3] and "weight_mean_cos" in steps[4]
    assert {"virtual_weight_cos_1", "virtual_weight_cos_2", "virtual_embedding_cos_2"} <= steps[8].keys()
    snapshot = next(e for e in events if isinstance(e, SnapshotEvent) and e.step == 8)
    live = torch.nn.functional.normalize(snapshot.class_weights[snapshot.class_weight_ages == 0], dim=1)
    for age in (1, 2):
        stored = torch.nn.functional.normalize(snapshot.class_weights[snapshot.class_weight_ages == age], dim=1)
        rows = snapshot.ages == age
        embeddings = torch.nn.functional.normalize(snapshot.embeddings[rows], dim=1)
        weight_cos = sum(float(stored[c] @ live[c]) for c in range(len(live))) / len(live)
        embedding_cos = sum(float(e @ live[c]) for e, c in zip(embeddings, snapshot.labels[rows], strict=True)) / len(
            embeddings)
        assert steps[8][f"virtual_weight_cos_{age}"] == pytest.approx(weight_cos, abs=1e-5)
        assert steps[8][f"virtual_embedding_cos_{age}"] == pytest.approx(embedding_cos, abs=1e-5)
    baseline = Trainer(small_config(memvir_n=0, snapshot_every=4, max_steps=4))
    baseline_events = collect(baseline)
    baseline.run()
    last = [e for e in baseline_events if isinstance(e, StepEvent)][-1].record()
    assert "weight_mean_cos" in last and not any(k.startswith("virtual_") for k in last)


def test_snapshots_carry_the_few_class_view_of_clean_training_images():
    """The focus classes' training images, read clean (after validation classes are held out too), embedded by the
    current model: item by item equal to the model on the clean render, written out here."""
    from memvir.data import load_dataset
    from memvir.data.glyphs.dataset import GLYPH_MEAN, GLYPH_STD
    from memvir.data.validation import validation_classes

    trainer = Trainer(small_config(val_classes=6, snapshot_every=2, max_steps=2, focus_classes=[0, 5, 17]))
    events = collect(trainer)
    trainer.run()
    snapshot = next(e for e in events if isinstance(e, SnapshotEvent))
    assert snapshot.focus_classes.tolist() == [0, 5, 17]
    assert snapshot.focus_labels.tolist() == [c for c in (0, 5, 17) for _ in range(12)]
    kept = [c for c in range(24) if c not in set(validation_classes(24, 6).tolist())]
    renders = load_dataset("glyphs-mini").train.renders
    trainer.model.eval()
    for row, (label, face) in enumerate((c, f) for c in (0, 5, 17) for f in range(12)):
        if row % 5:
            continue
        clean = ((torch.from_numpy(renders[kept[label], face]).float() / 255 - GLYPH_MEAN[0]) / GLYPH_STD[0])
        with torch.no_grad():
            expected = trainer.model(clean[None, None])[0]
        torch.testing.assert_close(snapshot.focus_embeddings[row], expected, rtol=1e-4, atol=1e-5)


def test_focus_classes_default_to_a_seeded_draw_and_change_live():
    first = Trainer(small_config(seed=4, max_steps=4, snapshot_every=2))
    again = Trainer(small_config(seed=4))
    default = first.snapshots.focus_classes.tolist()
    assert len(default) == 8 and default == sorted(default) and default == again.snapshots.focus_classes.tolist()
    events = collect(first)
    first.add_listener(lambda e: first.update(focus_classes=[3, 1]) if isinstance(e, StepEvent) and e.step == 2
                       else None)
    first.run()
    snapshots = [e for e in events if isinstance(e, SnapshotEvent)]
    assert [s.focus_classes.tolist() for s in snapshots] == [default, [3, 1]]
    assert any(isinstance(e, ControlEvent) and "focus_classes" in e.changes for e in events)
    with pytest.raises(ValueError, match=r"focus_classes \[24\] are not training classes of glyphs-mini"):
        first.update(focus_classes=[2, 24])
    with pytest.raises(ValueError, match="focus_classes must be at most 20 distinct"):
        first.update(focus_classes=list(range(21)))


def test_on_a_gpu_the_losses_are_checked_where_the_trainer_reports():
    """What the Trainer does on a GPU (checks every step's values only where it logs or saves, one host sync for
    the steps between), forced here on the CPU: a NaN at step 3 is found at step 5, the next logged step, before
    that step's update and before any checkpoint."""
    trainer = Trainer(small_config(log_every=5, snapshot_every=0, checkpoint_every=1000))
    trainer._checks_every_step = trainer.memvir.check_values = trainer.loss_fn.check_values = False
    events = collect(trainer)
    original = trainer.loss_fn.forward

    def poisoned(embeddings, labels, weights):
        loss = original(embeddings, labels, weights)
        return loss * float("nan") if trainer.step >= 2 else loss

    trainer.loss_fn.forward = poisoned
    with pytest.raises(TrainingDiverged, match="the loss became nan at step 3"):
        trainer.run()
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert [e.step for e in steps] == [1, 2, 3, 4] and trainer.step == 4
    assert steps[0].loss is not None and [e.loss for e in steps[1:]] == [None, None, None]
    assert trainer.state == "failed"


def test_seen_labels_put_the_stored_embeddings_in_their_own_classes_against_the_live_weights():
    """The control of memvir_labels="seen": the same memory's rows join the loss under their seen labels y (not
    y + jC), against the C live class weights only; "virtual" (MemVir) gives (k+1)C classes. N=1, M=0, no warm-up:
    step 2 has one stored batch."""
    def recording(loss_fn, calls):
        def call(x, y, w, *rest, **options):
            calls.append((x, y, w))
            return loss_fn(x, y, w, *rest, **options)
        return call

    seen_inputs = []
    for labels_mode in ("virtual", "seen"):
        trainer = Trainer(small_config(memvir_n=1, memvir_m=0, warmup_epochs=0, max_steps=2, memvir_labels=labels_mode))
        calls = []
        trainer.loss_fn = recording(trainer.loss_fn, calls)
        events = collect(trainer)
        trainer.run()
        steps = [e for e in events if isinstance(e, StepEvent)]
        x, y, w = calls[1]
        assert x.shape[0] == 64 and [e.num_virtual_sets for e in steps] == [0, 1]
        if labels_mode == "virtual":
            assert w.shape[0] == 48 and int(y[32:].min()) >= 24 and steps[1].num_classes == 48
            virtual_labels = y
        else:
            assert w is trainer.class_weights and steps[1].num_classes == 24
            seen_inputs = (y, virtual_labels)
    seen, virtual = seen_inputs
    assert torch.equal(seen, virtual % 24)  # the same rows, each stored row back in its own class


def test_seen_labels_refuse_the_balanced_reduction():
    with pytest.raises(ValueError, match="memvir_labels 'seen' .* use the official reduction"):
        small_config(memvir_labels="seen", memvir_reduction="balanced")


def test_the_papers_softmax_trains_on_the_raw_embeddings_and_every_other_loss_on_unit_vectors():
    """Softmax (the paper's eq. 2) gets the embedding head's raw output: its first step's loss is the cross-entropy of
    x @ W^T written out here with the model's un-normalised embeddings of the same batch; Norm-softmax gets unit
    vectors."""
    for loss, raw in (("softmax", True), ("norm-softmax", False)):
        trainer = Trainer(small_config(loss=loss, memvir_n=0, max_steps=1))
        seen = []
        loss_fn = trainer.loss_fn

        def record(x, y, w, *rest, loss_fn=loss_fn, seen=seen, **options):
            seen.append((x.detach().clone(), y.clone(), w.detach().clone()))
            return loss_fn(x, y, w, *rest, **options)

        trainer.loss_fn = record
        images, labels = next(iter(trainer.batches.epoch(0, 0)))
        model_state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        trainer.run()
        x, y, w = seen[0]
        norms = x.norm(dim=1)
        if raw:
            assert not torch.allclose(norms, torch.ones_like(norms), atol=1e-3)  # not unit vectors
            check = Trainer(small_config(loss=loss, memvir_n=0, max_steps=1))
            check.model.load_state_dict(model_state)
            check.model.train()
            with torch.no_grad():
                expected_x = check.model(images, normalize=False)
            torch.testing.assert_close(x, expected_x, rtol=1e-5, atol=1e-5)
            logits = x.double() @ w.double().T  # the paper's eq. 2, by hand: no normalisation, no bias
            by_hand = (torch.logsumexp(logits, dim=1) - logits[torch.arange(len(y)), y]).mean()
            first_step = next(record for record in trainer.history if record["type"] == "step")
            torch.testing.assert_close(torch.tensor(first_step["loss"], dtype=torch.float64), by_hand,
                                       rtol=1e-5, atol=1e-5)
        else:
            torch.testing.assert_close(norms, torch.ones_like(norms), rtol=1e-5, atol=1e-5)


def test_the_model_gives_raw_embeddings_on_request_and_unit_vectors_otherwise():
    model = EmbeddingModel(backbone="convnet", embedding_dim=8, in_channels=1, image_size=32, mean=[0.5], std=[0.5])
    images = torch.randn(3, 1, 32, 32)
    model.eval()
    raw, unit = model(images, normalize=False), model(images)
    torch.testing.assert_close(unit, raw / raw.norm(dim=1, keepdim=True))
