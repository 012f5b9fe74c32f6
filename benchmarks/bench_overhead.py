"""The plugin's overhead per profiled region against a bare torch.profiler session.

For a few functions, times (median of N) of: the bare call, the call inside a plain
``torch.profiler.profile`` session (with result parsing), and the call inside
``pytest_fusioncheck``'s capture (profiler + op observer + report building, warm-up
excluded). Prints a markdown table. Runs on CPU here; on a GPU with CUDA activities.

    PYTHONPATH=. python3 benchmarks/bench_overhead.py [--device cpu|cuda] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

HERE = __file__.rsplit("/", 1)[0]
sys.path.insert(0, HERE)
sys.path.insert(0, HERE + "/../tests")
from _common import add_out_option, write_output_to  # noqa: E402
from fidelity_cases import five_op_softmax, softmax_last  # noqa: E402

from pytest_fusioncheck.capture import profile_call  # noqa: E402
from pytest_fusioncheck.graph_breaks import GraphBreakRecorder  # noqa: E402
from pytest_fusioncheck.sources.bytes_model import inductor_hooks  # noqa: E402


class MLPBlock(torch.nn.Module):
    """The overhead table's ``mlp_block``: LayerNorm, Linear, GELU, Linear, residual add."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def interleaved(fns, reps):
    """Median seconds of each of ``fns``, timed in turn ``reps`` times."""
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, acc in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return [statistics.median(acc) for acc in times]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=15)
    add_out_option(parser)
    opts = parser.parse_args()
    write_output_to(opts.out, __file__)
    device = opts.device
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    print(f"device: {device} ({torch.cuda.get_device_name() if device == 'cuda' else 'host'}), torch {torch.__version__}, median of {opts.reps}")
    print("| case | bare call | torch.profiler | fusioncheck capture | overhead vs torch.profiler |")
    print("|---|---|---|---|---|")
    cases = {
        "five_op_softmax": (five_op_softmax, (torch.randn(64, 1024, device=device),)),
        "torch.softmax": (softmax_last, (torch.randn(64, 1024, device=device),)),
        "mlp_block": (MLPBlock(256).to(device), (torch.randn(16, 256, device=device),)),
    }
    for name, (fn, args) in cases.items():
        fn(*args)
        _sync(device)

        def bare():
            fn(*args)
            _sync(device)

        def plain_profiler():
            with torch.profiler.profile(activities=activities) as p:
                fn(*args)
                _sync(device)
            p.events()

        def ours():
            profile_call(fn, args, {}, warmup=0, device=device, timing=False)

        # Interleaved (bare, profiler, ours, bare, ...), so that a drift of the machine's speed
        # during the run weighs on the three alike. As inside a test: fixture.test_call keeps
        # Inductor's hooks and a graph-break recorder open for the whole test call, so a region
        # does not reopen them.
        with inductor_hooks(), GraphBreakRecorder():
            t_bare, t_prof, t_ours = interleaved((bare, plain_profiler, ours), opts.reps)
        print(f"| {name} | {t_bare * 1e3:.2f} ms | {t_prof * 1e3:.2f} ms | {t_ours * 1e3:.2f} ms | {t_ours - t_prof:+.4f} s ({t_ours / t_prof:.2f}x) |")


if __name__ == "__main__":
    main()
