"""Training on several processes (torch.distributed, gloo on the CPU) follows one process on the whole batch.

Two ranks with batch B/2 each must take the single-process run's steps with batch B: the same losses, the same
MemVir memory, the same class weights and metrics; rank 0 alone writes the run folder and talks to listeners. Each
rank computes its share of the loss (memvir.losses, "Shares"): on 2 and 3 ranks, every loss's summed shares and their
gradients are the one-process step's.
"""

import importlib.util
import json
import multiprocessing
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

from memvir import MemVir, TrainConfig, Trainer
from memvir.events import StepEvent
from memvir.losses import LOSSES, build_loss
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


def join_world(rank: int, port: int, world_size: int = WORLD_SIZE) -> None:
    """The environment torchrun gives rank `rank` of `world_size`, on this machine only."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size), RANK=str(rank),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)  # several processes on a shared CPU


# every loss, both reductions, MemVir's labels and the seen control (which the Trainer allows with official only)
LOSS_CASES = [(name, reduction, labels) for name in LOSSES for reduction, labels in
              (("official", "virtual"), ("balanced", "virtual"), ("official", "seen"))]
CLASSES = 5


def step_as_the_trainer(world: World, network: nn.Module, memvir: MemVir, loss_fn: nn.Module, inputs: torch.Tensor,
                        labels: torch.Tensor, initial_weights: torch.Tensor, reduction: str, labels_mode: str) -> dict:
    """One step as the Trainer takes it (its _embed, _memvir_loss and _update): this rank's embeddings gathered with
    autograd, MemVir, this rank's share of the loss, G times the share backpropagated, the class weights' gradient
    averaged. Returns the summed loss, CurricularFace's t and the network's and class weights' gradients."""
    weights = nn.Parameter(initial_weights.clone())
    network.zero_grad(set_to_none=True)
    out = memvir(world.gather_with_grad(network(inputs)), world.gather(labels), weights)
    embeddings, all_labels, all_weights = out
    options = {"live": out.live, "classes_per_set": CLASSES if reduction == "balanced" else None}
    if labels_mode == "seen":
        all_labels, all_weights, options["live"] = all_labels % CLASSES, weights, (out.num_live_rows, CLASSES)
    if world.is_distributed:
        options["share"] = world.loss_share
    share = loss_fn(embeddings, all_labels, all_weights, **options)
    (share * world.world_size).backward()
    world.average_(weights.grad)
    parameters = dict(getattr(network, "module", network).named_parameters())  # DDP's own names start "module."
    return {"loss": world.sum(share.detach()), "t": getattr(loss_fn, "t", torch.zeros(())).clone(),
            "class_weights": weights.grad, **{name: parameters[name].grad for name in ("weight", "bias")}}


def loss_shares_through_gather(world: World) -> dict:
    """Three steps (k = 0, 1, 2 virtual sets: a real MemVir(2, 0)) of every loss case on a linear network under
    DDP, each rank computing its share of the loss, and the same steps in this process on the whole batch with the
    one-process code (no share): {(loss, reduction, labels, step, quantity): (distributed, single)}."""
    batch, features, dim = 12, 3, 4  # 6 live rows per rank of 2, 4 per rank of 3; stored sets split alike
    data = torch.Generator().manual_seed(7)
    # float64: what is compared is the arithmetic of the split, not float32's rounding at scale 64
    steps = [(torch.randn(batch, features, generator=data, dtype=torch.float64),
              torch.randint(CLASSES, (batch,), generator=data)) for _ in range(3)]
    initial_weights = torch.randn(CLASSES, dim, generator=data, dtype=torch.float64)
    torch.manual_seed(3)
    single_net, net = nn.Linear(features, dim).double(), nn.Linear(features, dim).double()
    net.load_state_dict(single_net.state_dict())
    replicated = DistributedDataParallel(net)  # kept alive through backward: its hooks average the gradients
    rows = world.batch_rows(batch)
    results = {}
    for name, reduction, labels_mode in LOSS_CASES:
        distributed = (MemVir(2, 0), build_loss(name))
        single = (MemVir(2, 0), build_loss(name))
        for step, (inputs, labels) in enumerate(steps):
            got = step_as_the_trainer(world, replicated, *distributed, inputs[rows], labels[rows], initial_weights,
                                      reduction, labels_mode)
            expected = step_as_the_trainer(World(), single_net, *single, inputs, labels, initial_weights, reduction,
                                           labels_mode)
            assert distributed[0].num_virtual_sets == single[0].num_virtual_sets == step
            for quantity, value in got.items():
                results[(name, reduction, labels_mode, step, quantity)] = (value.detach(), expected[quantity].detach())
    return results


def spawn_ranks(function, world_size: int, tmp_path_factory) -> Path:
    """Run function(rank, (port, port), folder) on `world_size` ranks, each a process of its own; the folder they
    wrote to.

    The ranks fork from multiprocessing's forkserver, which imported torch and the Trainer once (as tests/cli_process.py
    and the app's runs do), instead of each spawning an interpreter that imports them again: what a rank computes does
    not depend on how its process started, and test_torchrun_cli_trains_resumes_and_reports_once starts real
    torchrun ranks. On this 2-core machine gloo's TCP transport now and then aborts a rank early on ("terminate called
    without an active exception", seen in about 1 of 30 runs, a few seconds in): start the ranks again, on a new port
    and folder, up to twice. What the tests assert is unchanged."""
    if "forkserver" in torch.multiprocessing.get_all_start_methods():
        start_method = "forkserver"
        # read only when this test process's forkserver starts (the first process it forks may be a CLI's or a run's)
        multiprocessing.get_context("forkserver").set_forkserver_preload(["memvir.train.trainer", "test_distributed"])
    else:
        start_method = "spawn"
    for attempt in range(3):
        folder = tmp_path_factory.mktemp("ddp")
        try:
            torch.multiprocessing.start_processes(function, args=((free_port(), free_port()), folder),
                                                  nprocs=world_size, join=True, start_method=start_method)
            return folder
        except torch.multiprocessing.ProcessExitedException:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def train_rank(rank: int, ports: tuple[int, int], folder: Path) -> None:
    """One of three spawned processes: the loss's shares on three ranks (results to shares{rank}.pt), then, the first
    two alone, the loss's shares on two ranks and the two-rank run (results to result{rank}.pt). One spawn for both
    worlds: each process's start (importing torch) costs more than the checks."""
    join_world(rank, ports[0], world_size=3)
    World.from_environment().start(torch.device("cpu"))
    torch.save(loss_shares_through_gather(World.from_environment()), folder / f"shares{rank}.pt")
    torch.distributed.destroy_process_group()
    if rank >= WORLD_SIZE:
        return
    join_world(rank, ports[1])
    heard = []
    trainer = Trainer(equivalence_config(), folder / f"run{rank}", listeners=[heard.append])
    shares = loss_shares_through_gather(trainer.world)
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
        "shares": shares,
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
    """The spawned processes' results (three ranks' loss shares; two ranks' loss shares and run) and the
    single-process run with the whole batch."""
    folder = spawn_ranks(train_rank, 3, tmp_path_factory)
    ranks = [torch.load(folder / f"result{rank}.pt", weights_only=True) for rank in range(WORLD_SIZE)]
    three_ranks = [torch.load(folder / f"shares{rank}.pt", weights_only=True) for rank in range(3)]
    single = Trainer(equivalence_config(), folder / "single")
    single.run()
    return folder, ranks, single, three_ranks


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_each_rank_computing_its_share_of_the_loss_gives_the_one_process_step(world_size, runs):
    """Every loss, both reductions and the seen control, k = 0, 1, 2: on 2 and 3 gloo ranks, the summed loss,
    CurricularFace's t and the network's and class weights' gradients equal the one-process step's to 1e-10 in
    float64, on every rank
    (the one-process code itself is checked against the whole logit matrix in tests/test_blocked_losses.py)."""
    ranks = [result["shares"] for result in runs[1]] if world_size == 2 else runs[3]
    for shares in ranks:
        assert len(shares) == len(LOSS_CASES) * 3 * 5
        for key, (distributed, single) in shares.items():
            torch.testing.assert_close(distributed, single, rtol=1e-10, atol=1e-10,
                                       msg=lambda message, key=key: f"{key}: {message}")
    for shares in ranks[1:]:  # the same bits on every rank: the replicas never part
        assert all(torch.equal(shares[key][0], ranks[0][key][0]) for key in shares)


@pytest.mark.slow
def test_two_ranks_with_half_batches_follow_one_process(runs):
    _, (rank0, rank1), single, _ = runs
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
    _, (rank0, rank1), _, _ = runs
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
    _, (rank0, rank1), _, _ = runs
    assert rank0["controlled"] == rank1["controlled"] == ("stopped", 3, 1)


@pytest.mark.slow
def test_only_rank_zero_writes_and_speaks(runs):
    folder, (rank0, rank1), single, _ = runs
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
    assert [row[0].strip() for row in rows] == [
        "baseline (N=0)", "MemVir N=3 M=1, memory full, float32 store",
        "MemVir N=3 M=1, float32 store, the loss over the whole matrix (before the blocks)",
        "MemVir N=3 M=1, memory full, float16 store"]
    assert [int(row[1]) for row in rows] == [0, n, n, n]
    assert [int(row[2]) for row in rows] == [classes, 4 * classes, 4 * classes, 4 * classes]
    # each row's images/s over the baseline's, as printed
    for row in rows:
        assert float(row[4]) == pytest.approx(float(row[3]) / float(rows[0][3]), abs=0.02)
    assert all(row[6].strip() == "-" and row[8].strip() == "-" for row in rows)  # no GPU: no peak, no sync check
    # the ring: N(M+1) steps of B embeddings and C class weights (D floats each) and B int64 labels
    for row, float_bytes in zip(rows[1:], (4, 4, 2), strict=True):
        expected = n * (m + 1) * ((batch + classes) * dim * float_bytes + batch * 8) / 2**20
        assert float(row[7]) == pytest.approx(expected, abs=0.05)
    assert float(rows[0][7]) == 0.0


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
