"""How fast the CPU runs a decode step's matrix products: SmolLM2-135M's 211 weight shapes (30 layers of q, k, v, o,
gate, up, down, then the 49,152 x 576 LM head) as distinct random tensors, 8 rows, as F.linear (x @ W.T), as W @ x.T
(the fast sampler's decode before ae32daa), as 8 matrix-vector products, with 2 and 1 threads; oneDNN on weights
packed for 8 rows (the fast sampler's CPU decode since ae32daa), and the time to pack them; the time to sum the same
0.54 GB (what reading the weights once costs); two Python threads with half the rows each.
    python tests/decode_matmul_probe.py      (not collected by pytest; logs/cpu-decode-profile-2026-11-26.log)
"""
import threading, time

import torch
import torch.nn.functional as F

torch.manual_seed(0)
SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # q k v o gate up down
Ws = [torch.randn(o, i) * 0.02 for _ in range(30) for (o, i) in SHAPES] + [torch.randn(49152, 576) * 0.02]
xs = {i: torch.randn(8, i) for i in (576, 1536)}


def best_ms(f, weights=Ws, n=20):
    """Best of 3 of the mean over n rounds of f(W, x) for every weight, in ms."""
    for W in weights:
        f(W, xs[W.shape[1]])
    best = 1e9
    for _ in range(3):
        s = time.perf_counter()
        for _ in range(n):
            for W in weights:
                f(W, xs[W.shape[1]])
        best = min(best, (time.perf_counter() - s) / n)
    return best * 1000


lin = lambda W, x: F.linear(x, W)
wm = lambda W, x: (W @ x.T).T.contiguous()
mv = lambda W, x: torch.stack([W @ x[i] for i in range(x.shape[0])])
for th in (2, 1):
    torch.set_num_threads(th)
    print(f"threads {th}: F.linear {best_ms(lin):.1f} ms, W@x.T {best_ms(wm):.1f} ms, 8 mv {best_ms(mv):.1f} ms")
torch.set_num_threads(2)
s = time.perf_counter()
packed = {id(W): torch.ops.mkldnn._reorder_linear_weight(W, 8) for W in Ws}
pack_s = time.perf_counter() - s
onednn = lambda W, x: torch.ops.mkldnn._linear_pointwise(x, packed[id(W)], None, "none", [], "")
diff = max((onednn(W, xs[W.shape[1]]) - lin(W, xs[W.shape[1]])).abs().max().item() for W in Ws)
print(f"oneDNN, weights packed for 8 rows: {best_ms(onednn):.1f} ms (layers {best_ms(onednn, Ws[:-1]):.1f}, head "
      f"{best_ms(onednn, Ws[-1:]):.1f}; W@x.T: layers {best_ms(wm, Ws[:-1]):.1f}, head {best_ms(wm, Ws[-1:]):.1f}); "
      f"packing all took {pack_s * 1000:.0f} ms; max |difference| to F.linear {diff:.1e}")
print(f"sum of all weights {best_ms(lambda W, x: W.sum()):.1f} ms, bytes {sum(W.numel() for W in Ws) * 4 / 1e9:.3f} GB")
torch.set_num_threads(1)                     # two Python threads, each half of every weight's rows, one thread each
halves = [(W[:W.shape[0] // 2], W[W.shape[0] // 2:]) for W in Ws]


def worker(k, out):
    for pair in halves:
        out.append(pair[k] @ xs[pair[k].shape[1]].T)


def two():
    threads = [threading.Thread(target=worker, args=(k, [])) for k in (0, 1)]
    [t.start() for t in threads], [t.join() for t in threads]


best = 1e9
for _ in range(5):
    s = time.perf_counter()
    two()
    best = min(best, time.perf_counter() - s)
print(f"two python threads (each 1 intra-op thread, half rows): {best * 1000:.1f} ms")
