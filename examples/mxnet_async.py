"""d2l's asynchronous-computation demo (the MXNet multi-GPU seed), on every backend.

MXNet's Python front end only queues work for its C++ engine: ``c = a * b + 2`` returns
at once and the result arrives later. Anything that needs the value waits for it
(``print(c)``, ``c.asnumpy()``); ``c.wait_to_read()`` waits for one array and
``nd.waitall()`` for everything. So a timer read right after a loop of MXNet calls
measures how fast work was *queued*, not done. PyTorch and Paddle on a CPU compute
eagerly (a GPU is asynchronous for them too).

polytrain names the sync points the same on every backend:

    MXNet                    polytrain                            PyTorch
    c.wait_to_read()         backend.to_numpy(c) (a host copy)    c.cpu() / c.item()
    nd.waitall()             backend.synchronize()                torch.cuda.synchronize()

This program queues the same matrix products on each backend and times them twice:
when the loop returns, and after ``backend.synchronize()``. Only the second is the cost.

    python examples/mxnet_async.py --backend mxnet
    python examples/mxnet_async.py --backend torch --size 500 --repeat 20
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from polytrain import get_backend


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", default=None, help="torch, paddle or mxnet")
    p.add_argument("--size", type=int, default=400, help="matrices are SIZE x SIZE")
    p.add_argument("--repeat", type=int, default=50, help="products queued per measurement")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)

    backend = get_backend(args.backend, threads=args.threads)
    ops = backend.functional()
    device = backend.device("cpu")

    # a = nd.ones((1, 2)); b = nd.ones((1, 2)); c = a * b + 2; print(c)  -> [[3. 3.]]
    # (a * b with b = ones is a @ identity: the functional ops have matmul and add)
    a = backend.to_tensor(np.ones((1, 2), np.float32), device)
    b = backend.to_tensor(np.eye(2, dtype=np.float32), device)
    c = ops.add(ops.matmul(a, b), backend.to_tensor(np.full((1, 2), 2.0, np.float32), device))
    print("c =", backend.to_numpy(c), "(to_numpy waits for c, like print(c) or wait_to_read())")

    x = backend.to_tensor(np.eye(args.size, dtype=np.float32) * 0.5, device)
    y = x
    ops.matmul(x, x)
    backend.synchronize()  # warm-up done before timing

    start = time.perf_counter()
    for _ in range(args.repeat):
        y = ops.matmul(y, x)
    returned = time.perf_counter() - start  # without a sync point: queueing time on MXNet
    backend.synchronize()  # nd.waitall()
    finished = time.perf_counter() - start
    value = float(backend.to_numpy(y)[0, 0])

    print(f"{backend.name}: {args.repeat} products of {args.size}x{args.size} matrices")
    print(f"  loop returned after      {1e3 * returned:8.1f} ms")
    print(f"  backend.synchronize() at {1e3 * finished:8.1f} ms  <- the time the work took")
    if finished > 3 * returned:
        print("  asynchronous: time only after a sync point (synchronize / to_numpy)")
    else:
        print("  synchronous here: the loop itself did the work")
    return {"returned": returned, "finished": finished, "value": value}


if __name__ == "__main__":
    main()
