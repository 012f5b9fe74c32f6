"""Prints, for a compiled GPT-2 MLP called directly and through a lambda (GPU), each kernel
of the report with its op, and the profiler events that attribute it: the op and graph
ranges, the launches and their correlation ids. The open question it answers is in
docs/bytes.md ("Known misses": the lambda's second GEMM carried no op on the H200).

    PYTHONPATH=$PWD python3 scripts/extern_attribution_probe.py
"""
import sys, torch
sys.path.insert(0, "tests")
from fidelity_cases import GPT2MLP
from pytest_fusioncheck.capture import profile_call
from pytest_fusioncheck._compat import kineto_events
from pytest_fusioncheck.sources import kernels_cuda
torch.manual_seed(0)
for form in ("direct", "lambda"):
    torch._dynamo.reset()
    mlp = torch.compile(GPT2MLP(1024).to(device="cuda", dtype=torch.bfloat16))
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    captured = {}
    orig = kernels_cuda.cuda_kernels
    def spy(prof, ops, triton, names=None):
        captured["prof"], captured["ops"] = prof, ops
        return orig(prof, ops, triton, names)
    kernels_cuda.cuda_kernels = spy
    fn = mlp if form == "direct" else (lambda: mlp(x))
    args = (x,) if form == "direct" else ()
    r = profile_call(fn, args, {}, warmup=1, device="cuda", timing=False)
    kernels_cuda.cuda_kernels = orig
    print("==", form); print(r.table())
    print("ops:", [(o.index, o.op, o.kind) for o in captured["ops"]])
    for e in kineto_events(captured["prof"]):
        n = e.name()
        if "fusioncheck" in n or "Launch" in n or "launch" in n or "addmm" in n or "nvjet" in n:
            print(f"   {n[:60]:60s} dev={e.device_type()} corr={e.correlation_id()} lcorr={e.linked_correlation_id()} tid={e.start_thread_id()} start={e.start_ns()} end={e.end_ns()}")
