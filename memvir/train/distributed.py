"""Multi-process training with torch.distributed: which process this is, and the few collectives the Trainer needs.

`torchrun` starts one process per GPU (or per CPU worker) and tells each its place through the environment
(WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). `World.from_environment()` reads it; a plain
`python -m memvir` has no WORLD_SIZE and gets the one-process world, whose collectives return their input, so the
Trainer's loop reads the same either way.

How the ranks share one MemVir step (docs/distributed.md has the user's view):
- `TrainConfig.batch_size` is the global batch B. Every rank draws the same seeded list of batches and takes rows
  [r*B/G, (r+1)*B/G) of each (`batch_rows`): the pieces in rank order are the single-process batch.
- MemVir needs the whole batch. `gather_with_grad` all-gathers the embeddings with autograd (`_GatherRows`), whose
  backward hands each rank the gradient of its own rows, summed over the ranks; labels are gathered plainly. Every
  rank then holds the same global batch, runs the same MemVir step and stores the same memory.
- The loss's rows are split (memvir.losses, "Shares"): rank r computes share `loss_share` = (r, G) of the loss, its
  piece of the live rows and of each virtual set's rows against every class, and the reductions divide by the
  counts of all rows (every rank holds every label), so the G shares sum to the single-process loss, and so do their
  gradients. Each rank's logits are 1/G of the whole. The step's loss is the sum of the shares (`sum`), the same on
  every rank. Proxy-Anchor, a sum over proxies of logs of sums over all rows, splits its proxies instead: rank r
  computes its piece of each set's proxies against every row.
- Gradient scaling: each rank backpropagates G times its share, so that the mean over the ranks of what they
  backpropagate is the loss L. The gather's backward sums the ranks' gradients, which gives rank r G * dL/dx_r for
  its own rows, and DistributedDataParallel averages the network's parameter gradients over the G ranks, which
  cancels the factor G: the network gets exactly the single-process gradient sum_r dL/dx_r dx_r/dtheta. The class
  weights are not in DDP: each rank holds G times its share's gradient, and `average_` (an all-reduce, then / G)
  gives every rank the sum of the shares', the single-process gradient, with the same bits on every rank, so that
  the replicas never drift apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


def _environment_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer; torchrun sets it, so start "
                         "the run with torchrun, or unset it for a single process") from None


class _GatherRows(torch.autograd.Function):
    """All-gather along dim 0, in rank order, as an autograd function: the backward gives each rank the sum over the
    ranks of the gradients of its own rows.

    This is what torch.distributed.nn.functional.all_gather computes; that function is deprecated in recent torch
    in favour of a private module, so these few lines on public collectives run alike on every torch we support.
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:
        ctx.rows = slice(rank * tensor.shape[0], (rank + 1) * tensor.shape[0])
        parts = [torch.empty_like(tensor) for _ in range(world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()  # the collective works in place; autograd's buffer is not ours to change
        dist.all_reduce(grad)
        return grad[ctx.rows], None, None


@dataclass(frozen=True)
class World:
    """This process's place among the training processes: `rank` of `world_size`, `local_rank` on its machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_environment(cls) -> World:
        """The world torchrun describes in the environment; one process when WORLD_SIZE is unset."""
        world_size = _environment_int("WORLD_SIZE", 1)
        rank = _environment_int("RANK", 0)
        local_rank = _environment_int("LOCAL_RANK", rank)
        if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
            raise ValueError(f"inconsistent torchrun environment: WORLD_SIZE={world_size}, RANK={rank}, "
                             f"LOCAL_RANK={local_rank}; RANK must lie in [0, WORLD_SIZE)")
        return cls(rank=rank, world_size=world_size, local_rank=local_rank)

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 speaks for the run: it alone writes files and talks to listeners."""
        return self.rank == 0

    # -------------------------------------------------------------------------------------- setting up
    def batch_rows(self, batch_size: int) -> slice:
        """This rank's rows of every global batch of `batch_size`: a contiguous G-th, in rank order."""
        if batch_size % self.world_size:
            below = batch_size - batch_size % self.world_size
            suggestion = f"{below} or {below + self.world_size}" if below else f"{self.world_size}"
            raise ValueError(f"batch_size {batch_size} is the global batch and must divide evenly among the "
                             f"{self.world_size} processes; use a multiple of {self.world_size}, e.g. {suggestion}")
        share = batch_size // self.world_size
        return slice(self.rank * share, (self.rank + 1) * share)

    def start(self, device: torch.device) -> torch.device:
        """Join the process group (nccl on CUDA, gloo on the CPU) and return this process's device: on a GPU,
        `cuda:LOCAL_RANK`. A single process returns `device` unchanged."""
        if not self.is_distributed:
            return device
        if device.type == "cuda":
            device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(device)  # NCCL and broadcast_object_list use the current device
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        if (dist.get_rank(), dist.get_world_size()) != (self.rank, self.world_size):
            raise ValueError(f"the process group already running has rank {dist.get_rank()} of "
                             f"{dist.get_world_size()}, but the environment says rank {self.rank} of {self.world_size}")
        return device

    # -------------------------------------------------------------------------------------- collectives
    def gather_with_grad(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's `tensor` concatenated along dim 0 in rank order; the gradient flows back to each rank's own
        rows (summed over the ranks, see the module docstring)."""
        if not self.is_distributed:
            return tensor
        return _GatherRows.apply(tensor, self.world_size, self.rank)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's `tensor` (same shape on every rank) concatenated along dim 0 in rank order, no gradient."""
        if not self.is_distributed:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    def shard(self, total: int) -> list[int] | None:
        """This rank's contiguous share of `total` items (sizes differ by one at most); None for a single process,
        meaning all of them."""
        if not self.is_distributed:
            return None
        return torch.tensor_split(torch.arange(total), self.world_size)[self.rank].tolist()

    def gather_shards(self, tensor: torch.Tensor, total: int, device: torch.device) -> torch.Tensor:
        """The rows of all ranks' `shard(total)` in item order, from each rank's rows of its own shard.

        The exchange goes through `device` (NCCL moves CUDA tensors only); the result is on `tensor`'s device.
        """
        if not self.is_distributed:
            return tensor
        sizes = [len(part) for part in torch.tensor_split(torch.arange(total), self.world_size)]
        padded = torch.zeros(max(sizes), *tensor.shape[1:], dtype=tensor.dtype, device=device)
        padded[: tensor.shape[0]] = tensor  # all_gather needs one shape on every rank
        parts = self.gather(padded).to(tensor.device).split(max(sizes))
        return torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])

    @property
    def loss_share(self) -> tuple[int, int]:
        """This rank's share of the loss, the keyword ``share`` of a memvir.losses loss: (rank, world size)."""
        return self.rank, self.world_size

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's `tensor` (same shape on every rank), no gradient; the same on every rank."""
        if not self.is_distributed:
            return tensor
        total = tensor.detach().clone()  # the collective works in place
        dist.all_reduce(total)
        return total

    def average_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Overwrite `tensor` in place with the mean of every rank's: the same on every rank."""
        if self.is_distributed:
            dist.all_reduce(tensor)
            tensor.div_(self.world_size)
        return tensor

    def agree(self, value):
        """Rank 0's `value` (any picklable object) on every rank: the decisions only rank 0 can make."""
        if not self.is_distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def launch_command(self) -> str:
        """How this process was started, for a model card: `python` or `torchrun --nproc-per-node ...`."""
        if not self.is_distributed:
            return "python"
        per_node = _environment_int("LOCAL_WORLD_SIZE", self.world_size)
        nodes = self.world_size // per_node
        return "torchrun " + (f"--nnodes {nodes} " if nodes > 1 else "") + f"--nproc-per-node {per_node}"


def shutdown() -> None:
    """Leave the process group, if one was started (at the end of a torchrun process)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
