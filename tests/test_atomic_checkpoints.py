"""Checkpoints are atomic as the README promises: a run folder killed at any moment of a write still loads, and what
the kill left behind is cleaned up by the next writer."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from memvir import TrainConfig, Trainer, checkpoint
from memvir.hub import load_model
from memvir.models.embedding_model import EmbeddingModel

ROOT = Path(__file__).resolve().parents[1]
FILES = ("config.json", "model.safetensors", "README.md", "trainer_state.pt")


def small_run(folder: Path, max_steps: int = 1) -> Trainer:
    config = TrainConfig(dataset="glyphs-mini", batch_size=32, memvir_n=2, memvir_m=1, warmup_epochs=0,
                         snapshot_every=0, eval_every=0, eval_at_start=False, max_steps=max_steps)
    trainer = Trainer(config, folder)
    trainer.run()
    return trainer


def assert_loads(folder: Path) -> int:
    """Every file of the checkpoint is there and loads as `memvir eval` and a resume read it; the saved step."""
    for name in FILES:
        assert (folder / name).is_file(), f"{name} is missing: {sorted(p.name for p in folder.iterdir())}"
    EmbeddingModel.from_pretrained(folder)
    load_model(folder)  # the path of `memvir eval`, `memvir index` and the app
    state = checkpoint.load_state(folder / "trainer_state.pt")
    assert set(state) >= {"config", "model", "optimizer", "memvir", "step"}
    return state["step"]


def test_a_checkpoint_caught_between_any_two_renames_still_loads(tmp_path, monkeypatch):
    """The moments a kill could land between the renames of one checkpoint, each made to happen on purpose."""
    trainer = small_run(tmp_path)
    renames = []

    def replace_then_die(source, target):
        if Path(target).parent == tmp_path:  # renames into the run folder, not those inside the temporary one
            if len(renames) == stop_after:
                raise KeyboardInterrupt("killed")
            renames.append(Path(target).name)
        os.rename(source, target)

    monkeypatch.setattr(checkpoint.os, "replace", replace_then_die)
    for stop_after in range(len(FILES)):
        renames.clear()
        trainer.step += 1  # a newer checkpoint than the one on disk
        with pytest.raises(KeyboardInterrupt):
            trainer.save_checkpoint()
        assert renames == list(FILES[:stop_after])  # config.json, then the weights, the card, the trainer state
        assert assert_loads(tmp_path) == 1  # the trainer state, renamed last, is still the previous one
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()
    trainer.save_checkpoint()
    assert assert_loads(tmp_path) == trainer.step


def test_saving_a_model_over_a_folder_never_leaves_it_without_its_files(tmp_path, monkeypatch):
    model = EmbeddingModel(dataset="glyphs-mini")
    model.save_pretrained(tmp_path)
    seen = []

    def replace_and_look(source, target):
        os.rename(source, target)
        seen.append(sorted(name for name in ("config.json", "model.safetensors", "README.md")
                           if (tmp_path / name).is_file()))

    monkeypatch.setattr(checkpoint.os, "replace", replace_and_look)
    model.save_pretrained(tmp_path, metrics={"recall@1": 0.5})
    assert seen and all(files == ["README.md", "config.json", "model.safetensors"] for files in seen)
    assert "0.5000" in (tmp_path / "README.md").read_text()  # the card was refreshed


TRAINERS = textwrap.dedent("""
    import os, sys
    from memvir.events import StepEvent
    from memvir.train.trainer import Trainer

    for _ in sys.stdin:  # one training process per line, forked from this one so that none pays for the imports
        pid = os.fork()
        if pid == 0:
            print("child", os.getpid(), flush=True)
            trainer = Trainer.from_run_folder(sys.argv[1], checkpoint_every=1, epochs=1000, max_steps=100_000,
                                     snapshot_every=0, eval_every=0)
            # each step is announced just before its checkpoint is written
            trainer.add_listener(lambda e: print("step", e.step, flush=True) if isinstance(e, StepEvent) else None)
            trainer.run()
            os._exit(0)
        os.waitpid(pid, 0)
        print("gone", flush=True)
""")


@pytest.mark.slow
def test_kill_9_at_random_moments_of_a_run_that_checkpoints_every_step(tmp_path):
    small_run(tmp_path)
    rng = random.Random(12)
    caught_mid_write = 0
    steps = []
    trainers = subprocess.Popen([sys.executable, "-c", TRAINERS, str(tmp_path)], cwd=ROOT, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    try:
        # Until five kills have landed in the middle of a write (about one in four does, as fast as the machine
        # writes), at most 40: a fixed count of kills made the check a matter of the machine's speed.
        for _ in range(40):
            if caught_mid_write >= 5:
                break
            trainers.stdin.write("train\n")
            trainers.stdin.flush()
            kind, pid = trainers.stdout.readline().split()
            assert kind == "child"
            for _ in range(rng.randint(2, 3)):  # the checkpoint of the step before is complete by now
                assert trainers.stdout.readline().startswith("step")
            time.sleep(rng.uniform(0.0, 0.4))  # then somewhere in this step's checkpoint, or just after it
            os.kill(int(pid), signal.SIGKILL)
            while (line := trainers.stdout.readline()) != "gone\n":
                assert line.startswith("step")
            caught_mid_write += any(p.name.startswith(".") and p.name.endswith(".tmp") for p in tmp_path.iterdir())
            steps.append(assert_loads(tmp_path))
    finally:
        trainers.kill()
        trainers.wait(timeout=60)
    assert caught_mid_write >= 5  # kills did land in the middle of writes, which the folder survived
    assert steps == sorted(steps) and steps[-1] > steps[0]  # and the run made progress between the kills

    resumed = subprocess.run([sys.executable, "-m", "memvir", "train", "--out", tmp_path, "--resume", "--max-steps",
                              str(steps[-1] + 1)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"})
    assert resumed.returncode == 0, resumed.stderr
    assert assert_loads(tmp_path) == steps[-1] + 1
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # what the kills left is gone


def test_only_stale_temporaries_of_ours_are_removed(tmp_path):
    before_this_process = checkpoint._STARTED - 60

    def made(path: Path, folder: bool = False, stale: bool = True) -> Path:
        if folder:
            path.mkdir()
            (path / "model.safetensors").write_bytes(b"half")
        else:
            path.write_bytes(b"half")
        if stale:
            os.utime(path, (before_this_process, before_this_process))
        return path

    stale = [made(tmp_path / ".trainer_state.pt.abc.tmp"), made(tmp_path / ".metrics.jsonl.def.tmp"),
             made(tmp_path / ".checkpoint.ghi.tmp", folder=True)]
    kept = [made(tmp_path / ".trainer_state.pt.new.tmp", stale=False),  # this process may be writing it
            made(tmp_path / ".checkpoint.new.tmp", folder=True, stale=False),
            made(tmp_path / ".notes.tmp"), made(tmp_path / "draft.tmp"),  # not ours
            made(tmp_path / ".checkpoint.odd.tmp")]  # a file where ours is a folder
    assert sorted(checkpoint.remove_stale_temporaries(tmp_path)) == sorted(stale)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in kept)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_counts_what_was_written_before_its_fork_as_an_earlier_writers(tmp_path):
    """The app's run processes fork from a forkserver that imported memvir long before: a temporary a killed run
    left after that import is still stale to the process resuming it."""
    left = tmp_path / ".trainer_state.pt.killed.tmp"
    left.write_bytes(b"half")
    os.utime(left, (time.time() - 1, time.time() - 1))  # written after this process started, before the fork
    assert checkpoint.remove_stale_temporaries(tmp_path) == []  # this process may be writing it
    child = os.fork()
    if child == 0:  # in the forked process: nothing but the call and its verdict as exit status
        os._exit(0 if checkpoint.remove_stale_temporaries(tmp_path) == [left] else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and not left.exists()


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    path = tmp_path / "trainer_state.pt"
    checkpoint.save_state({"step": 1}, path)

    def half_then_fail(handle):
        handle.write(b"half a checkpoint")
        raise OSError("the writer failed")

    with pytest.raises(OSError, match="the writer failed"):
        checkpoint.atomic_write(path, half_then_fail)
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["trainer_state.pt"]
    assert (path.stat().st_mode & 0o777) == 0o644
