"""A tiny elastic training job: linear regression with DDP over gloo, under torchrun.

Run by ``torchrun`` (the pytorch and pytorch-elastic adapters of
workloads/frameworks/torch.py start it so): it reads RANK, WORLD_SIZE, LOCAL_RANK and
TORCHELASTIC_RESTART_COUNT from torchrun, and from Mesh MESH_CHECKPOINT_DIR (or
``--checkpoint-dir``) and MESH_PROGRESS_FILE.

Why it is built so:
- torchrun restarts every worker at each membership change (a new rendezvous round), so
  a process start *is* a new generation: the job resumes from the newest checkpoint and
  saves one at once, marking the generation in the checkpoint directory.
- Ranks are not stable across rounds, and the checkpoint directory may be local to each
  node: every node's local rank 0 saves (atomically: a temporary file, then a rename),
  and at start the ranks agree on the newest step any of them holds and take the state
  from that rank (a broadcast), so a survivor's checkpoint wins over a stale one.
- A resize stops the workers (SIGTERM from torchrun on a scale-up; a gloo "connection
  closed" error on a scale-down). Parameters only change in ``optimizer.step()``, so at
  either moment they hold the last completed step: the worker saves that step and
  leaves. Steps repeat only when a worker is killed outright (SIGKILL, a lost node):
  then at most ``--save-every - 1`` steps since the last periodic checkpoint.
- One JSON line per step (rank 0) in ``<checkpoint dir>/train.jsonl``, and one
  ``"event": "start"`` line per process start (with ``boot``: when its ``main`` module
  ran, torch was ``imported``, the process ``group`` formed and the ``state`` was
  agreed and loaded), so a test or the bench reads the world
  size, step and loss over time; rank 0 writes its step to MESH_PROGRESS_FILE.
- Each step sleeps (``--step-sleep``, 50 ms) so a run lasts long enough to be resized.
- ``--stop-file``: a run as long as its driver needs (a test, the bench) ends like one
  of ``--steps``: every rank stops after the step in which any of them saw the file.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
_MAIN = time.time()  # for the start line's `boot`: where a new generation's time goes

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

FEATURES = 8
SAMPLES = 2048
BATCH = 64  # the global batch, split between the ranks
KEEP = 3  # checkpoints kept


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="total steps, then exit 0")
    p.add_argument("--save-every", type=int, default=20, help="checkpoint every K steps")
    p.add_argument("--step-sleep", type=float, default=0.05, help="seconds per step")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--gloo-timeout", type=float, default=30.0, help="collective timeout, s")
    p.add_argument(
        "--stop-file",
        default="",
        help="end (exit 0, like --steps) after the step during which this file appears",
    )
    p.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("MESH_CHECKPOINT_DIR", ""),
        help="default: $MESH_CHECKPOINT_DIR",
    )
    args = p.parse_args(argv)
    if not args.checkpoint_dir:
        p.error("--checkpoint-dir or MESH_CHECKPOINT_DIR is required")
    return args


def _dataset() -> tuple[torch.Tensor, torch.Tensor]:
    """The same data on every rank and every run: y = X·w + b + noise, seeded."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = x @ w + 0.5 + 0.01 * torch.randn(SAMPLES, 1, generator=g)
    return x, y


def _batch(step: int, rank: int, world: int) -> torch.Tensor:
    """This rank's share of step's global batch: a function of the step alone, so a
    resumed step sees the data it would have seen."""
    idx = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(step))[:BATCH]
    return idx.tensor_split(world)[rank]


def _checkpoints(root: Path) -> list[Path]:
    return sorted(root.glob("ckpt-*.pt"))


def _save(root: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    state = {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}
    tmp = root / f".ckpt-{step:08d}.{os.getpid()}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, root / f"ckpt-{step:08d}.pt")
    for old in _checkpoints(root)[:-KEEP]:
        old.unlink(missing_ok=True)  # another node may have removed it already


def _load_newest(root: Path) -> dict | None:
    for path in reversed(_checkpoints(root)):
        try:
            return torch.load(path, weights_only=True)
        except (OSError, RuntimeError, EOFError):
            continue  # being removed, or torn by a kill: take the one before
    return None


def _agree(state: dict | None) -> dict | None:
    """Every rank ends with the state of the rank that holds the newest step."""
    mine = torch.tensor([state["step"] if state else -1])
    steps = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, mine)
    best = max(range(len(steps)), key=lambda r: int(steps[r]))
    if int(steps[best]) < 0:
        return None
    box = [state if dist.get_rank() == best else None]
    dist.broadcast_object_list(box, src=best)
    return box[0]


class _Log:
    def __init__(self, path: Path, rank: int) -> None:
        self._f = path.open("a", buffering=1) if rank == 0 else None

    def write(self, **fields: object) -> None:
        if self._f is not None:
            self._f.write(json.dumps({**fields, "ts": round(time.time(), 3)}) + "\n")


def _progress(step: int) -> None:
    path = os.environ.get("MESH_PROGRESS_FILE")
    if path:
        tmp = f"{path}.tmp"
        Path(tmp).write_text(f"{step}\n")
        os.replace(tmp, path)


def _leave(code: int) -> None:
    """Exit at once, skipping the interpreter's teardown (gloo's threads and torch's
    destructors take seconds on a loaded host): torchrun waits for this process before
    it starts the next round, so this is time every resize saves. The checkpoint is
    already renamed into place and the log is line-buffered."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str]) -> int:
    args = _args(argv)
    root = Path(args.checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    stopping = False

    def _on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _on_term)
    torch.manual_seed(0)
    imported = time.time()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.gloo_timeout))
    grouped = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    saver = int(os.environ.get("LOCAL_RANK", "0")) == 0
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log = _Log(root / "train.jsonl", rank)

    model = torch.nn.Linear(FEATURES, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = _agree(_load_newest(root))
    step = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
    loaded = time.time()
    ddp = DistributedDataParallel(model)
    boot = {"main": _MAIN, "imported": imported, "group": grouped, "state": loaded}
    boot = {k: round(v, 3) for k, v in boot.items()}
    log.write(event="start", step=step, world_size=world, rank=rank, restart=restart, boot=boot)
    if saver:
        _save(root, step, model, opt)  # the new generation's first checkpoint
    x, y = _dataset()
    try:
        while step < args.steps and not stopping:
            idx = _batch(step, rank, world)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x[idx]), y[idx])
            loss.backward()  # DDP averages the gradients over the ranks here
            # The loss summed and whether any rank saw the stop file, in one collective:
            # the step's last, after it nothing fails, and every rank ends at one step.
            told = bool(args.stop_file) and os.path.exists(args.stop_file)
            mean = torch.stack([loss.detach(), torch.tensor(float(told))])
            dist.all_reduce(mean)
            opt.step()
            step += 1
            loss_mean = round(float(mean[0]) / world, 6)
            log.write(step=step, loss=loss_mean, world_size=world, rank=rank)
            if rank == 0:
                _progress(step)
            last = step == args.steps or float(mean[1]) > 0
            if saver and (step % args.save_every == 0 or last):
                _save(root, step, model, opt)
            if last:
                break
            time.sleep(args.step_sleep)
    except (RuntimeError, dist.DistBackendError) as exc:
        # A peer left (a scale-down, a failure): the parameters still hold `step`.
        if saver:
            _save(root, step, model, opt)
        print(
            f"tiny: rank {rank} failed at step {step} ({time.time():.3f}): {exc}", file=sys.stderr
        )
        _leave(1)
    if stopping:
        if saver:
            _save(root, step, model, opt)
        log.write(event="stopped", step=step, world_size=world, rank=rank)
        print(f"tiny: rank {rank} stopped at step {step} ({time.time():.3f})", file=sys.stderr)
        _leave(0)
    log.write(event="done", step=step, world_size=world, rank=rank)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
