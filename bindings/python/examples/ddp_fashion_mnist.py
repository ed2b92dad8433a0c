"""Train a small CNN on Fashion-MNIST with torch DDP, five ways, and log accuracy, time and bytes.

    mpirun -np 4 --oversubscribe /usr/bin/python3 bindings/python/examples/ddp_fashion_mnist.py \
        --hook gradiveq --epochs 2 --csv /tmp/gradiveq.csv

--hook: none (gloo's allreduce), powersgd (PyTorch's own PowerSGD hook, the anchor), and the gvq
hooks plain, qsgd, gradiveq. Two ways to start the ranks:
- mpirun: the rank and size come from Open MPI's environment, MASTER_ADDR/PORT from rank 0
  through mpi4py; gvq's hooks run over MPI;
- a launcher's environment without MPI (torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
  Debian's torchrun fails on Python 3.11, so scripts/gvq-launch.sh sets them, and
  perf/emulate-cluster.sh -L does on the emulated cluster): gloo meets on MASTER_PORT and gvq's
  hooks get their communicator through torch's store, over UCX.
DDP's own process group is gloo. Same seed, same data order, same epochs for every hook. Data:
/usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist).
"""

import argparse
import gzip
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gvq  # noqa: E402
import gvq.ddp  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def load(kind):
    with gzip.open(os.path.join(DATA, "%s-images-idx3-ubyte.gz" % kind)) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(DATA, "%s-labels-idx1-ubyte.gz" % kind)) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    x = torch.from_numpy(x.astype(np.float32) / 255.0)
    return (x - 0.2860) / 0.3530, torch.from_numpy(y.astype(np.int64))


class Net(nn.Module):
    """Two 5x5 convs (32 and 64 filters) and two fc layers: conv2 is GradiVeQ's tensor."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def interface_address(name):
    """The IPv4 address of network interface `name` (SIOCGIFADDR)."""
    import fcntl
    import struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("256s", name.encode()[:15])
        return socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])


def init_process_group(mpi):
    """gloo's rendezvous through rank 0's address: 127.0.0.1 on one host; with GVQ_SOCKET_IFNAME
    (perf/emulate-cluster.sh sets it: every rank in a network namespace of its own) rank 0's
    address on that interface, and gloo's traffic on it too (GLOO_SOCKET_IFNAME)."""
    ifname = os.environ.get("GVQ_SOCKET_IFNAME")
    if ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
    addr = port = None
    if mpi.Get_rank() == 0:
        addr = interface_address(ifname) if ifname else "127.0.0.1"
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
    addr, port = mpi.bcast((addr, port), root=0)
    os.environ.setdefault("MASTER_ADDR", addr)
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=mpi.Get_rank(), world_size=mpi.Get_size())


class EnvWorld:
    """The rank and size a launcher set (RANK, WORLD_SIZE), in mpi4py's shape for main()."""

    def Get_rank(self):
        return int(os.environ["RANK"])

    def Get_size(self):
        return int(os.environ["WORLD_SIZE"])


def world():
    """mpi4py's world inside an MPI job, else the launcher's environment (gloo then meets at
    MASTER_ADDR:MASTER_PORT, gloo's traffic on GVQ_SOCKET_IFNAME when set)."""
    if any(os.environ.get(v) for v in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK")):
        from mpi4py import MPI
        mpi = MPI.COMM_WORLD
        init_process_group(mpi)
        return mpi
    ifname = os.environ.get("GVQ_SOCKET_IFNAME")
    if ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
    env = EnvWorld()
    dist.init_process_group("gloo", rank=env.Get_rank(), world_size=env.Get_size())
    return env


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hook", default="gradiveq",
                    choices=["none", "powersgd", "plain", "qsgd", "gradiveq"])
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--target", type=float, default=0.86, help="test accuracy to time")
    ap.add_argument("--eval-every", type=int, default=200, help="steps")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many (0: epochs)")
    ap.add_argument("--powersgd-rank", type=int, default=4)
    ap.add_argument("--sample-iters", type=int, default=20)
    ap.add_argument("--compressed-iters", type=int, default=200)
    ap.add_argument("--qsgd-bits", type=int, default=4)
    ap.add_argument("--csv", default="")
    args = ap.parse_args()

    torch.set_num_threads(1)
    mpi = world()
    rank, size = mpi.Get_rank(), mpi.Get_size()
    xtr, ytr = load("train")
    xte, yte = load("t10k")
    torch.manual_seed(args.seed)
    # PowerSGD's hook chains its allreduces in future callbacks; with several buckets on gloo
    # those of different buckets interleave differently on each rank (gloo aborts on the size
    # mismatch), so it gets one bucket -- the first one too, which DDP caps separately (1 MiB)
    if args.hook == "powersgd":
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1000 << 20
    model = DDP(Net(), bucket_cap_mb=1000 if args.hook == "powersgd" else 25)
    state = None
    if args.hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                 start_powerSGD_iter=10, random_seed=args.seed)
        model.register_comm_hook(state, ps.powerSGD_hook)
    elif args.hook != "none":
        kw = {}
        if args.hook == "gradiveq":
            kw = dict(sample_iters=args.sample_iters, compressed_iters=args.compressed_iters,
                      vote_threshold=1.0, rest="qsgd", qsgd_bits=args.qsgd_bits)
        elif args.hook == "qsgd":
            kw = dict(qsgd_bits=args.qsgd_bits)
        state = gvq.ddp.register(model, args.hook, **kw)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    n = xtr.shape[0]
    steps_per_epoch = n // (args.batch * size)
    total = args.max_steps or int(args.epochs * steps_per_epoch)
    g = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(n, generator=g)
    log, t_target, t0, train_time = [], None, time.time(), 0.0

    def evaluate():
        model.eval()
        with torch.no_grad():
            pred = torch.cat([model.module(xte[i:i + 1000]).argmax(1)
                              for i in range(0, xte.shape[0], 1000)])
        model.train()
        return (pred == yte).float().mean().item()

    for step in range(total):
        if step and step % steps_per_epoch == 0:
            perm = torch.randperm(n, generator=g)
        s = (step % steps_per_epoch) * args.batch * size + rank * args.batch
        idx = perm[s:s + args.batch]
        ts = time.time()
        opt.zero_grad()
        F.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
        opt.step()
        train_time += time.time() - ts
        if (step + 1) % args.eval_every == 0 or step + 1 == total:
            acc = evaluate()
            log.append((step + 1, train_time, acc))
            if t_target is None and acc >= args.target:
                t_target = train_time
            if rank == 0:
                print("step %d  train %.1fs  test accuracy %.4f" % (step + 1, train_time, acc),
                      flush=True)
    # bytes each rank sends per step: gvq counts its ring's wire; gloo's allreduce and the
    # PowerSGD hook's are estimated as a ring's, 2(N-1)/N times the allreduced payload
    ring = 2.0 * (size - 1) / size
    fp32 = 4.0 * sum(p.numel() for p in model.parameters())
    if isinstance(state, gvq.ddp.GvqHookState):
        st = state.stats()
        sent = st["wire_bytes"] / total
        state.close()
    elif args.hook == "powersgd":
        rate = state.compression_stats()[0]  # fp32 elements / sent ones, compressed steps
        sent = ring * fp32 / rate if rate > 0 else ring * fp32
    else:
        sent = ring * fp32
    if rank == 0:
        acc = log[-1][2]
        print("hook=%s ranks=%d steps=%d test_accuracy=%.4f train_seconds=%.1f "
              "seconds_to_%.2f=%s bytes_sent_per_step=%.0f (fp32 ring: %.0f, %.1fx fewer)" %
              (args.hook, size, total, acc, train_time, args.target,
               "%.1f" % t_target if t_target is not None else "not reached", sent, ring * fp32,
               ring * fp32 / sent if sent else 0.0))
        if args.csv:
            with open(args.csv, "w") as f:
                f.write("hook,step,train_seconds,test_accuracy\n")
                for st_, t, a in log:
                    f.write("%s,%d,%.3f,%.4f\n" % (args.hook, st_, t, a))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
