"""Elastic data-parallel training in Python: a torch MLP on Fashion-MNIST whose ranks may die.

    bash scripts/gvq-launch.sh -n 3 --keep-going -- /usr/bin/python3 \
        bindings/python/examples/elastic_fashion_mnist.py --steps 600 --commit 50 --die 2:170 --replace

Started without mpirun (a launcher's environment: torchrun's variables, here gvq-launch.sh), so
a process that dies ends no job; gvq over UCX. What gvq-train --elastic does in C, here with
gvq's Python API:
- every step each rank computes the gradient of its share of the global batch and the ranks
  average it (Communicator.allreduce, gvq.AVG) into SGD with momentum, kept as flat vectors;
- every --commit steps each rank copies the step, its place in the epoch, the weights and the
  momentum (in memory; the last two);
- a call that fails (gvq.GvqError: a peer died or stalled) ends the step on every survivor:
  they shrink (Communicator.shrink(abort=True): the same communicator on every survivor),
  agree on the commit to go back to (the least of their latest), restore it, scale the learning
  rate by ranks left / first size (the per-rank batch stays) and run the lost steps again;
- --replace: at the first commit after a fault rank 0 starts one process per rank lost (this
  script with --join), all grow into a communicator of the first size (Communicator.grow / join:
  a new unique id, passed on the command line) and rank 0 broadcasts the commit to them.
--die R:S (tests): the process first ranked R leaves at step S (os._exit: no goodbye). At the
end every rank prints its held-out loss and whether the weights are identical on every rank;
the exit status is 0 when they are and the loss fell (a replacement still in the run checks
itself; rank 0 waits for the ones it started and says how each ended).
"""

import argparse
import gzip
import hashlib
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gvq  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"
ID_BYTES = 128  # sizeof(gvqUniqueId)


def load(kind, n):
    with gzip.open(os.path.join(DATA, "%s-images-idx3-ubyte.gz" % kind)) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)[:n]
    with gzip.open(os.path.join(DATA, "%s-labels-idx1-ubyte.gz" % kind)) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    x = (torch.from_numpy(x.astype(np.float32) / 255.0) - 0.2860) / 0.3530
    return x, torch.from_numpy(y.astype(np.int64))


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--commit", type=int, default=50)
    p.add_argument("--batch", type=int, default=32, help="images per rank and step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--train-subset", type=int, default=12000)
    p.add_argument("--die", action="append", default=[], help="R:S")
    p.add_argument("--replace", action="store_true")
    p.add_argument("--timeout-ms", type=int, default=3000)
    p.add_argument("--join", help=argparse.SUPPRESS)  # a replacement's: the unique id (hex),
    p.add_argument("--join-rank", type=int, help=argparse.SUPPRESS)  # its rank,
    p.add_argument("--join-size", type=int, help=argparse.SUPPRESS)  # the grown size,
    p.add_argument("--first-rank", type=int, help=argparse.SUPPRESS)  # the rank it reports
    return p.parse_args()


class Run:
    def __init__(self, args):
        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.a = args
        self.model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
        self.w = torch.nn.utils.parameters_to_vector(self.model.parameters()).detach().numpy().copy()
        self.v = np.zeros_like(self.w)
        self.x, self.y = load("train", args.train_subset)
        self.tx, self.ty = load("t10k", 2000)
        self.loss0 = self.loss(self.tx, self.ty)  # the first weights', the same on every rank
        self.step = self.pos = self.epoch = 0
        self.perm = None
        self.commits = []  # the last two: (step, pos, epoch, w, v)
        self.kids = []
        self.faults = self.lost = 0
        if args.join:
            self.comm = gvq.Communicator.join(args.join_size, bytes.fromhex(args.join),
                                              args.join_rank, timeout_ms=args.timeout_ms)
            self.first = args.first_rank
            self.n0 = args.join_size
            self.receive()
        else:
            self.comm = gvq.Communicator.from_env(timeout_ms=args.timeout_ms)
            self.first = self.comm.rank
            self.n0 = self.comm.size
        self.lr = args.lr * self.comm.size / self.n0
        self.die = {int(r): int(s) for r, s in (d.split(":") for d in args.die)}

    def shuffle(self):
        self.perm = np.random.default_rng(1000 + self.epoch).permutation(len(self.x))

    def loss(self, x, y, grad=False):
        torch.nn.utils.vector_to_parameters(torch.from_numpy(self.w), self.model.parameters())
        self.model.zero_grad()
        out = F.cross_entropy(self.model(x), y)
        if not grad:
            return float(out)
        out.backward()
        return np.concatenate([p.grad.numpy().ravel() for p in self.model.parameters()])

    def train_step(self):
        n, b = self.comm.size, self.a.batch
        if self.perm is None or self.pos + n * b > len(self.x):
            self.epoch += 1 if self.perm is not None else 0
            self.pos = 0
            self.shuffle()
        idx = self.perm[self.pos + self.comm.rank * b:self.pos + (self.comm.rank + 1) * b]
        g = self.loss(self.x[idx], self.y[idx], grad=True).astype(np.float32)
        self.comm.allreduce(g, g, op=gvq.AVG)  # in place; raises gvq.GvqError on a fault
        self.v = 0.9 * self.v + g
        self.w = self.w - self.lr * self.v
        self.pos += n * b
        self.step += 1

    def take_commit(self):
        self.commits = (self.commits + [(self.step, self.pos, self.epoch, self.w.copy(),
                                         self.v.copy())])[-2:]

    def recover(self, t_fail):
        old = self.comm
        self.comm = old.shrink(abort=True)  # raises when this rank is left out
        t_shrunk = time.time()
        old.destroy()
        back = np.array([self.commits[-1][0]], np.int64)
        self.comm.allreduce(back, back, op=gvq.MIN)
        c = [c for c in self.commits if c[0] == back[0]][0]
        lost = self.step - c[0]
        self.step, self.pos, self.epoch, self.w, self.v = c[0], c[1], c[2], c[3].copy(), c[4].copy()
        self.commits = [c]
        self.shuffle()
        self.lr = self.a.lr * self.comm.size / self.n0
        self.faults += 1
        self.lost += lost
        if self.comm.rank == 0:
            print("fault: %d ranks left; shrink %.3f s, back to step %d (%d lost), lr %.4f"
                  % (self.comm.size, t_shrunk - t_fail, self.step, lost, self.lr), flush=True)

    def handoff(self):
        h = np.array([self.step, self.pos, self.epoch], np.int64)
        self.comm.broadcast(h, root=0)
        self.comm.broadcast(self.w, root=0)
        self.comm.broadcast(self.v, root=0)
        return h

    def receive(self):
        h = self.handoff()
        self.step, self.pos, self.epoch = int(h[0]), int(h[1]), int(h[2])
        self.shuffle()
        print("[%d] joined as rank %d of %d at step %d" % (self.first, self.comm.rank,
                                                           self.comm.size, self.step), flush=True)

    def maybe_grow(self):
        info = np.zeros(2, np.int64)  # grow?, the size; then the id
        uid = bytes(ID_BYTES)
        if self.comm.rank == 0 and len(self.kids) + self.n0 - self.comm.size <= 8:
            uid = gvq.get_unique_id()
            started = []
            try:
                for k in range(self.comm.size, self.n0):
                    started.append(subprocess.Popen(
                        [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] +
                        ["--join", uid.hex(), "--join-rank", str(k), "--join-size", str(self.n0),
                         "--first-rank", str(self.n0 + len(self.kids) + len(started))]))
                info[0], info[1] = int(bool(started)), self.n0
            except OSError as e:  # no grow without every replacement
                print("cannot start a replacement: %s" % e, flush=True)
                for k in started:
                    k.kill()
            self.kids += started
        self.comm.broadcast(info, root=0)
        if not info[0]:
            return
        idbuf = np.frombuffer(uid, np.uint8).copy()
        self.comm.broadcast(idbuf, root=0)
        old = self.comm
        self.comm = old.grow(int(info[1]), idbuf.tobytes(), timeout_ms=self.a.timeout_ms)
        old.destroy()
        self.handoff()
        self.lr = self.a.lr * self.comm.size / self.n0
        if self.comm.rank == 0:
            print("join at step %d: %d ranks again, lr %.4f" % (self.step, self.comm.size, self.lr),
                  flush=True)


def main():
    args = parse()
    r = Run(args)
    loss0 = r.loss0
    joined_at = r.step if args.join else -1
    while r.step < args.steps:
        t0 = time.time()
        try:
            if r.step % args.commit == 0:
                r.take_commit()
                if args.replace and r.step != joined_at:
                    r.maybe_grow()
            joined_at = -1  # a replacement skips only the grow it joined through
            if r.die.get(r.first) == r.step:
                print("[%d] leaves at step %d" % (r.first, r.step), flush=True)
                os._exit(0)
            r.train_step()
        except gvq.GvqError as e:
            print("[%d] step %d failed after %.3f s: %s" % (r.first, r.step, time.time() - t0,
                                                            e.name), flush=True)
            r.recover(t0)
        if r.comm.rank == 0 and r.step % 100 == 0:
            print("step %d: held-out loss %.4f (%d ranks)" % (r.step, r.loss(r.tx, r.ty),
                                                             r.comm.size), flush=True)
    loss1 = r.loss(r.tx, r.ty)
    h = np.array([int.from_bytes(hashlib.sha256(r.w.tobytes()).digest()[:7], "little")], np.int64)
    lo, hi = h.copy(), h.copy()
    r.comm.allreduce(lo, lo, op=gvq.MIN)
    r.comm.allreduce(hi, hi, op=gvq.MAX)
    ok = lo[0] == hi[0] and loss1 < 0.6 * loss0
    # one write: replacements share rank 0's output, and a line split in two writes interleaves
    sys.stdout.write("[%d] rank %d of %d: held-out loss %.4f -> %.4f, %d fault(s), %d step(s) run "
                     "again, weights %s: %s\n"
                     % (r.first, r.comm.rank, r.comm.size, loss0, loss1, r.faults, r.lost,
                        "identical on every rank" if lo[0] == hi[0] else "DIFFER",
                        "PASS" if ok else "FAIL"))
    sys.stdout.flush()
    r.comm.destroy()
    for k in r.kids:  # those still in the run took part in the checks above
        if k.wait() != 0:
            print("[%d] a replacement ended with status %d" % (r.first, k.returncode))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
