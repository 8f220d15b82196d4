"""Training on several processes (torch.distributed, gloo on the CPU) follows one process on the whole batch.

Two ranks with batch B/2 each must take the single-process run's steps with batch B: the same losses, the same
MemVir memory, the same class weights and metrics; rank 0 alone writes the run folder and talks to listeners.
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from memvir import TrainConfig, Trainer
from memvir.events import StepEvent
from memvir.losses import build_loss
from memvir.models.embedding_model import EmbeddingModel
from memvir.train.distributed import World

ROOT = Path(__file__).resolve().parents[2]
WORLD_SIZE = 2


def equivalence_config(**overrides) -> TrainConfig:
    # convnet-gn: GroupNorm makes an image's features independent of its batch; BatchNorm would see half batches
    values = dict(dataset="glyphs-mini", backbone="convnet-gn", batch_size=32, epochs=3, memvir_n=2, memvir_m=1,
                  warmup_epochs=0.5, log_every=1, eval_every=0, eval_at_start=False, snapshot_every=9,
                  checkpoint_every=1000)
    values.update(overrides)
    return TrainConfig(**values)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def join_world(rank: int, port: int) -> None:
    """The environment torchrun gives rank `rank` of two, on this machine only."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD_SIZE), RANK=str(rank),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD_SIZE))
    torch.set_num_threads(1)  # two processes on a shared CPU


def gradients_through_gather(world: World) -> dict:
    """One norm-softmax step of a linear network under DDP with gathered embeddings, and the same step computed by
    plain autograd on the whole batch in this process: the reference the distributed gradients must equal."""
    batch, features, dim, classes = 8, 3, 4, 5
    data = torch.Generator().manual_seed(7)
    inputs = torch.randn(batch, features, generator=data)
    labels = torch.randint(classes, (batch,), generator=data)
    torch.manual_seed(3)
    reference_net = nn.Linear(features, dim)
    reference_weights = nn.Parameter(torch.randn(classes, dim, generator=data))
    loss_fn = build_loss("norm-softmax")

    reference_inputs = inputs.clone().requires_grad_()
    loss_fn(reference_net(reference_inputs), labels, reference_weights).backward()

    net = nn.Linear(features, dim)
    net.load_state_dict(reference_net.state_dict())
    weights = nn.Parameter(reference_weights.detach().clone())
    rows = world.batch_rows(batch)
    local_inputs = inputs[rows].clone().requires_grad_()
    replicated = DistributedDataParallel(net)  # kept alive through backward: its hooks average the gradients
    embeddings = world.gather_with_grad(replicated(local_inputs))
    loss = loss_fn(embeddings, world.gather(labels[rows]), weights)
    loss.backward()
    return {
        "net_weight": (net.weight.grad, reference_net.weight.grad),
        "net_bias": (net.bias.grad, reference_net.bias.grad),
        "class_weights": (weights.grad, reference_weights.grad),
        # the gather's backward sums the ranks' (equal) losses: the inputs get G times their share; DDP's average
        # over the ranks divides the parameters' gradients by G again
        "inputs": (local_inputs.grad, WORLD_SIZE * reference_inputs.grad[rows]),
    }


def train_rank(rank: int, port: int, folder: Path) -> None:
    """One rank of the distributed run (spawned): a gradient check, then training; results go to result{rank}.pt."""
    join_world(rank, port)
    heard = []
    trainer = Trainer(equivalence_config(), folder / f"run{rank}", listeners=[heard.append])
    gradients = gradients_through_gather(trainer.world)
    state = trainer.run()

    # live control from rank 0's listeners (the only ones called) must hold on every rank, or the ranks would part
    controlled = Trainer(equivalence_config(epochs=1, snapshot_every=0))

    def control(event):
        if isinstance(event, StepEvent) and event.step == 1:
            controlled.update(memvir_n=1)
        if isinstance(event, StepEvent) and event.step == 3:
            controlled.stop()

    controlled.add_listener(control)
    torch.save({
        "state": state,
        "controlled": (controlled.run(), controlled.step, controlled.memvir.num_steps),
        "out_dir": None if trainer.out_dir is None else str(trainer.out_dir),
        "gradients": gradients,
        "history": trainer.history,
        "memvir": trainer.memvir.state_dict()["_extra_state"],
        "class_weights": trainer.class_weights.detach(),
        "model": trainer.model.state_dict(),
        "last_metrics": trainer.last_metrics,
        "events": [type(event).__name__ for event in heard],
    }, folder / f"result{rank}.pt")
    torch.distributed.destroy_process_group()


def step_losses(history: list[dict]) -> list[float]:
    return [record["loss"] for record in history if record["type"] == "step"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The two-rank run (spawned processes) and the single-process run with the whole batch."""
    # On this 2-core machine gloo's TCP transport now and then aborts a rank early on ("terminate called
    # without an active exception", seen in about 1 of 30 runs, a few seconds in): start the pair again, on a new
    # port and folder, up to twice. What the tests assert is unchanged.
    for attempt in range(3):
        folder = tmp_path_factory.mktemp("ddp")
        try:
            torch.multiprocessing.spawn(train_rank, args=(free_port(), folder), nprocs=WORLD_SIZE, join=True)
            break
        except torch.multiprocessing.ProcessExitedException:
            if attempt == 2:
                raise
    ranks = [torch.load(folder / f"result{rank}.pt", weights_only=True) for rank in range(WORLD_SIZE)]
    single = Trainer(equivalence_config(), folder / "single")
    single.run()
    return folder, ranks, single


@pytest.mark.slow
def test_gradients_through_the_gather_equal_the_whole_batch_gradient(runs):
    _, ranks, _ = runs
    for result in ranks:
        for name, (distributed, reference) in result["gradients"].items():
            torch.testing.assert_close(distributed, reference, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_two_ranks_with_half_batches_follow_one_process(runs):
    _, (rank0, rank1), single = runs
    assert rank0["state"] == rank1["state"] == "finished"
    expected = step_losses(single.history)
    assert len(expected) == single.total_steps == 27
    assert step_losses(rank0["history"]) == pytest.approx(expected, rel=1e-5)  # measured: 2e-7
    assert single.memvir.num_virtual_sets == 2  # the comparison covered virtual classes, not only the warm-up

    memory = single.memvir.state_dict()["_extra_state"]
    assert rank0["memvir"]["step"] == memory["step"] == 27
    assert torch.equal(rank0["memvir"]["labels"], memory["labels"])
    torch.testing.assert_close(rank0["memvir"]["embeddings"], memory["embeddings"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(rank0["memvir"]["class_weights"], memory["class_weights"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(rank0["class_weights"], single.class_weights.detach(), rtol=1e-4, atol=1e-5)
    for name, value in single.model.state_dict().items():
        torch.testing.assert_close(rank0["model"][name], value, rtol=1e-4, atol=1e-5, msg=name)
    for name, value in single.last_metrics.items():  # shards embed in other batch sizes: a near tie may flip
        assert rank0["last_metrics"][name] == pytest.approx(value, abs=0.01), name


@pytest.mark.slow
def test_every_rank_ends_in_the_same_state(runs):
    _, (rank0, rank1), _ = runs
    def without_speed(history):  # each rank times its own steps
        return [{k: v for k, v in record.items() if k != "images_per_s"} for record in history]

    assert without_speed(rank0["history"]) == without_speed(rank1["history"])
    assert rank0["last_metrics"] == rank1["last_metrics"]
    for key in ("embeddings", "labels", "class_weights", "batch_sizes"):
        assert torch.equal(rank0["memvir"][key], rank1["memvir"][key]), key
    assert torch.equal(rank0["class_weights"], rank1["class_weights"])
    for name, value in rank0["model"].items():
        assert torch.equal(rank1["model"][name], value), name


@pytest.mark.slow
def test_rank_zero_stops_and_updates_every_rank(runs):
    _, (rank0, rank1), _ = runs
    assert rank0["controlled"] == rank1["controlled"] == ("stopped", 3, 1)


@pytest.mark.slow
def test_only_rank_zero_writes_and_speaks(runs):
    folder, (rank0, rank1), single = runs
    assert rank0["out_dir"] == str(folder / "run0") and rank1["out_dir"] is None
    assert not (folder / "run1").exists()
    for name in ("config.json", "model.safetensors", "README.md", "metrics.jsonl", "trainer_state.pt"):
        assert (folder / "run0" / name).is_file(), name
    written = [json.loads(line) for line in (folder / "run0" / "metrics.jsonl").read_text().splitlines()]
    assert step_losses(written) == step_losses(rank0["history"])  # each record once: no second writer
    assert rank1["events"] == []
    assert rank0["events"].count("StepEvent") == single.total_steps
    assert rank0["events"].count("SnapshotEvent") == 3 and rank0["events"].count("EvalEvent") == 1


def test_batch_rows_split_the_global_batch_in_rank_order():
    batch = list(range(12))
    for world_size in (1, 2, 3, 4):
        pieces = [batch[World(rank, world_size).batch_rows(12)] for rank in range(world_size)]
        assert [len(piece) for piece in pieces] == [12 // world_size] * world_size
        assert sum(pieces, []) == batch


def test_shards_of_the_test_split_cover_it_in_order():
    for total in (7, 8, 1):
        shards = [World(rank, 3).shard(total) for rank in range(3)]
        assert sum(shards, []) == list(range(total))
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert World().shard(5) is None  # one process embeds everything


def test_a_batch_that_does_not_divide_among_the_ranks_is_refused():
    with pytest.raises(ValueError, match=r"batch_size 30 is the global batch and must divide evenly among the 4 "
                                         r"processes; use a multiple of 4, e.g. 28 or 32"):
        World(0, 4).batch_rows(30)
    with pytest.raises(ValueError, match="use a multiple of 4, e.g. 4$"):
        World(0, 4).batch_rows(3)


def test_the_trainer_refuses_an_indivisible_batch_before_waiting_for_other_ranks(monkeypatch):
    # rank 0 of 2 with no rank 1 anywhere: the check must come before the process group would wait for it
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError, match="batch_size 31 is the global batch and must divide evenly among the 2"):
        Trainer(equivalence_config(batch_size=31))


@pytest.mark.parametrize(
    "environment,message",
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, r"RANK must lie in \[0, WORLD_SIZE\)"),
        ({"WORLD_SIZE": "0"}, "inconsistent torchrun environment: WORLD_SIZE=0"),
    ],
)
def test_a_broken_torchrun_environment_is_named(monkeypatch, environment, message):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        World.from_environment()


def test_one_process_is_the_default_world(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    world = World.from_environment()
    assert (world.rank, world.world_size, world.is_distributed, world.is_main) == (0, 1, False, True)
    tensor = torch.arange(4.0)
    assert world.gather_with_grad(tensor) is tensor and world.gather(tensor) is tensor
    assert world.agree({"stop": True}) == {"stop": True}
    assert world.launch_command() == "python"


def test_convnet_gn_embeds_an_image_alike_alone_or_in_a_batch():
    torch.manual_seed(0)
    images = torch.randn(6, 1, 32, 32)
    for backbone, independent in (("convnet-gn", True), ("convnet", False)):
        model = EmbeddingModel(backbone=backbone, embedding_dim=16).train()  # training mode: batch statistics
        together = model(images)
        alone = torch.cat([model(images[i:i + 1]) for i in range(2)] + [model(images[2:])])
        assert torch.allclose(together, alone, atol=1e-5) == independent, backbone


def test_convnet_gn_has_no_pretrained_weights():
    with pytest.raises(ValueError, match=r"'convnet-gn' has no pretrained weights; set pretrained=False"):
        EmbeddingModel(backbone="convnet-gn", pretrained=True)


def test_compile_wraps_the_training_network_only():
    trainer = Trainer(equivalence_config(compile=True))
    assert trainer._network._orig_mod is trainer.model  # compiled lazily, at the first step (a GPU run's choice)
    assert isinstance(trainer.model, EmbeddingModel)  # evaluation and saving use the plain model
    with pytest.raises(ValueError, match="compile must be True or False, got 'yes'"):
        Trainer(equivalence_config(compile="yes"))


@pytest.mark.slow
def test_torchrun_cli_trains_resumes_and_reports_once(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    run = tmp_path / "run"

    def torchrun(*args):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                   "127.0.0.1", "--master-port", str(free_port()), "-m", "memvir", "train", *args, "--out", str(run)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        if result.returncode != 0 and "terminate called" in result.stderr:  # gloo's rare abort at connect (above)
            command[command.index("--master-port") + 1] = str(free_port())
            result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert result.returncode == 0, result.stderr
        printed = [line for line in result.stdout.splitlines() if line.startswith("{")]
        assert len(printed) == 1, result.stdout  # rank 0 alone reports
        return json.loads(printed[0])

    first = torchrun("--dataset", "glyphs-mini", "--backbone", "convnet-gn", "--batch-size", "32", "--max-steps", "3",
                     "--memvir-n", "1", "--memvir-m", "0", "--warmup-epochs", "0")
    assert first["step"] == 3
    assert "torchrun --nproc-per-node 2 -m memvir train" in (run / "README.md").read_text()

    resumed = torchrun("--resume", "--max-steps", "5")  # every rank reads the checkpoint rank 0 wrote
    assert resumed["step"] == 5
    state = torch.load(run / "trainer_state.pt", weights_only=True)
    assert state["step"] == 5 and state["memvir"]["_extra_state"]["step"] == 5  # the curriculum went on from 3
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "eval"] == [0, 3, 5]  # one writer: no record twice


def load_gpu_bench():
    """bench/gpu_throughput.py as a module (bench/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("gpu_throughput", ROOT / "bench" / "gpu_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.slow
def test_gpu_bench_dry_run_on_the_cpu_writes_its_table(tmp_path, capsys):
    bench = load_gpu_bench()
    out = tmp_path / "table.md"
    batch, classes, dim, n, m = 8, 98, 512, 3, 1
    assert bench.main(["--device", "cpu", "--backbone", "convnet", "--image-size", "32", "--batch-size", str(batch),
                       "--memvir-n", str(n), "--memvir-m", str(m), "--steps", "2", "--warmup", "1",
                       "--out", str(out)]) == 0
    text = out.read_text()
    assert text in capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| baseline")
            or line.startswith("| MemVir")]
    assert [row[0].strip() for row in rows] == ["baseline (N=0)", "MemVir N=3 M=1, memory full, float32 store",
                                                "MemVir N=3 M=1, memory full, float16 store"]
    assert [int(row[1]) for row in rows] == [0, n, n] and [int(row[2]) for row in rows] == [classes, 4 * classes,
                                                                                              4 * classes]
    assert all(row[5].strip() == "-" for row in rows)  # no GPU: no peak GPU memory
    # the ring: N(M+1) steps of B embeddings and C class weights (D floats each) and B int64 labels
    for row, float_bytes in zip(rows[1:], (4, 2), strict=True):
        expected = n * (m + 1) * ((batch + classes) * dim * float_bytes + batch * 8) / 2**20
        assert float(row[6]) == pytest.approx(expected, abs=0.05)
    assert float(rows[0][6]) == 0.0


def test_gpu_bench_refuses_cuda_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    bench = load_gpu_bench()
    assert bench.main(["--device", "cuda"]) == 2
    assert "torch sees no CUDA GPU; use --device cpu for a dry run" in capsys.readouterr().err


BLOCKED_TRAINING = """
import sys
for name in ("faiss", "gradio", "umap", "plotly", "trackio", "tensorboard"):
    sys.modules[name] = None  # any import of them fails, as on the lent GPU machine, which has none of them
from memvir import TrainConfig, Trainer
trainer = Trainer(TrainConfig(dataset="glyphs-mini", batch_size=32, max_steps=2, snapshot_every=1, eval_every=1))
print(trainer.run(), trainer.last_metrics["map@r"])
"""


@pytest.mark.slow
def test_training_runs_without_faiss_gradio_umap_or_plotly():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", BLOCKED_TRAINING], capture_output=True, text=True, env=env,
                            cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    state, map_at_r = result.stdout.split()
    assert state == "finished" and 0 <= float(map_at_r) <= 1
