"""Data-parallel training on one machine's cores (train.py --workers W).

One training process per core beats one process with W threads here: a step is thousands of
small ops, and two OpenMP threads ran a step 2x *slower* than one (measured on the 2-core EPYC).
So W single-threaded processes each run part of every batch and sum their gradients (gloo
all-reduce over loopback, one flat buffer per step); every process then takes the same
optimizer step and holds the same weights. Rank 0 is the process the user started: it spawns
the others (the same command line, NEEDLE_TRAIN_RANK set), prints, evaluates and saves.
"""

import datetime
import os
import socket
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

RANK_ENV, PORT_ENV = "NEEDLE_TRAIN_RANK", "NEEDLE_TRAIN_PORT"


class Workers:
    def __init__(self, world):
        self.world, self.rank, self.children = world, 0, []
        if world <= 1:
            return
        if RANK_ENV in os.environ:
            self.rank, port = int(os.environ[RANK_ENV]), int(os.environ[PORT_ENV])
            parent = os.getppid()

            def orphaned():  # rank 0 gone (killed, crashed): do not wait for it in gloo
                while os.getppid() == parent:
                    time.sleep(2)
                os._exit(1)
            threading.Thread(target=orphaned, daemon=True).start()
        else:
            with socket.socket() as sock:  # a free loopback port for the rendezvous
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            for r in range(1, world):
                env = dict(os.environ, **{RANK_ENV: str(r), PORT_ENV: str(port)})
                self.children.append(subprocess.Popen(
                    [sys.executable] + sys.argv, env=env, stdout=subprocess.DEVNULL))
        # Rank 0 evaluates and saves while the others wait in the next all-reduce.
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                                rank=self.rank, world_size=world,
                                timeout=datetime.timedelta(minutes=20))

    @property
    def main(self):
        return self.rank == 0

    def mine(self, items):
        """This rank's share of a list (every world-th item: a longest-first batch splits
        into shares of similar lengths)."""
        return items[self.rank::self.world]

    def sum_grads(self, params, extra):
        """Sums every rank's gradients of params (None = zeros) and the floats `extra`
        in place; returns the summed extras."""
        if self.world <= 1:
            return list(extra)
        flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else
                          torch.zeros(p.numel()) for p in params] +
                         [torch.tensor(extra, dtype=torch.float32)])
        dist.all_reduce(flat)
        k = 0
        for p in params:
            n = p.numel()
            p.grad = flat[k:k + n].view_as(p)  # flat is this step's own buffer
            k += n
        return flat[k:].tolist()

    def close(self):
        """Waits for the other ranks; nonzero if one failed."""
        if self.world <= 1:
            return 0
        dist.destroy_process_group()
        return max([c.wait() for c in self.children], default=0)
