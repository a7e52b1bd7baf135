"""How fast the CPU runs a decode step's matrix products: SmolLM2-135M's 211 weight shapes (30 layers of q, k, v, o,
gate, up, down, then the 49,152 x 576 LM head) as distinct random tensors, 8 rows, as F.linear (x @ W.T), as W @ x.T
(the fast sampler's weight-major decode), as 8 matrix-vector products, with 2 and 1 threads; then the time to sum the
same 0.54 GB (what reading the weights once costs) and two Python threads with half the rows each.
    python tests/decode_matmul_probe.py      (not collected by pytest; log: logs/cpu-decode-profile-2026-11-26.log)
"""
import torch, time, threading
torch.manual_seed(0)
shapes = [(576,576),(192,576),(192,576),(576,576),(1536,576),(1536,576),(576,1536)]
Ws = [torch.randn(o,i)*0.02 for _ in range(30) for (o,i) in shapes] + [torch.randn(49152,576)*0.02]
xs = {i: torch.randn(8,i) for i in (576,1536)}
def run(f):
    for W in Ws: f(W, xs[W.shape[1]])
def t(f, n=20):
    run(f); best=1e9
    for _ in range(3):
        s=time.perf_counter()
        for _ in range(n): run(f)
        best=min(best,(time.perf_counter()-s)/n)
    return best*1000
lin = lambda W,x: torch.nn.functional.linear(x,W)
wm = lambda W,x: (W @ x.T).T.contiguous()
mv = lambda W,x: torch.stack([W @ x[i] for i in range(x.shape[0])])
for th in (2,1):
    torch.set_num_threads(th)
    print(f"threads {th}: F.linear {t(lin):.1f} ms, W@x.T {t(wm):.1f} ms, 8 mv {t(mv):.1f} ms")
torch.set_num_threads(2)
# bandwidth: sum over all weights
print(f"sum of all weights {t(lambda W,x: W.sum()):.1f} ms, bytes {sum(W.numel() for W in Ws)*4/1e9:.3f} GB")
# two python threads, each half the output rows, 1 intra-op thread each
torch.set_num_threads(1)
halves = [(W[:W.shape[0]//2], W[W.shape[0]//2:]) for W in Ws]
def worker(k, out):
    for (a,b) in halves:
        W = (a,b)[k]; out.append(W @ xs[W.shape[1]].T)
def two():
    o1,o2=[],[]
    th=[threading.Thread(target=worker,args=(k,o)) for k,o in ((0,o1),(1,o2))]
    [x.start() for x in th]; [x.join() for x in th]
best=1e9
for _ in range(5):
    s=time.perf_counter(); two(); best=min(best,time.perf_counter()-s)
print(f"two python threads (each 1 intra-op thread, half rows): {best*1000:.1f} ms")
