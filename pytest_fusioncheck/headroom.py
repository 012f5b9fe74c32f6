"""Fusion headroom: which memory-bound kernels exchange tensors through HBM, and what
fusing each such chain would save (docs/headroom.md).

Pure logic over ``Kernel`` records: each kernel of an observed op carries the storages it
read and wrote (``Kernel.reads`` / ``Kernel.writes``: storage key -> bytes). Two
memory-bound kernels are in one chain when one reads a storage the other wrote earlier in
the region. A chain's *fused budget* is what one kernel doing its work would move: each
storage it reads before writing it, once, and each storage it writes that leaves the chain
(read by a kernel outside it, returned by the call, or never read again inside it), once.
Its *excess* is what the chain moved beyond that. A kernel is memory-bound unless it is a
GEMM, convolution or attention op (those are compute-bound; they can host an epilogue, but
are never proposed as chain members). Kernels without storages (generated kernels, Triton
launches, CUDA-graph replays) are not chained: their headroom is unknown, not zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

_COMPUTE_BOUND = frozenset(
    f"aten::{op}"
    for op in (
        "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_addmm_activation", "addmv", "mv",
        "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward", "_efficient_attention_forward", "scaled_dot_product_attention",
    )
)


@dataclass
class Chain:
    """Memory-bound kernels that exchange tensors through HBM."""

    kernels: list[int]  # indices into the report's kernels, in launch order
    ops: list[str]
    source: str | None
    bytes: int  # what the chain's kernels moved (modelled)
    fused_bytes: int  # what one fused kernel would move
    time_s: float | None = None  # the chain's device time (GPU); None on CPU: bytes only

    @property
    def excess(self) -> int:
        return max(0, self.bytes - self.fused_bytes)

    @property
    def ratio(self) -> float:
        return self.bytes / self.fused_bytes if self.fused_bytes else float("inf")

    def saving_s(self, peak_bandwidth: float | None) -> float | None:
        """The time fusing would save (``None`` without a peak; docs/headroom.md).

        With the chain's device time: that time less one fused kernel's at the peak (the
        chain's kernels rarely run at the peak themselves); without (CPU): the excess bytes
        at the peak.
        """
        if not peak_bandwidth:
            return None
        if self.time_s is not None:
            return max(0.0, self.time_s - self.fused_bytes / peak_bandwidth)
        return self.excess / peak_bandwidth

    def describe(self, peak_bandwidth: float | None = None, region_time_s: float | None = None) -> str:
        from .budget import format_bytes
        from .report import format_time, index_ranges

        span = "kernels " + index_ranges(self.kernels)  # runs, cut after a few: 0-6, 11-17, ... (35 in all)
        names = ", ".join(dict.fromkeys(op.removeprefix("aten::") for op in self.ops))
        where = f"; {self.source}" if self.source else ""
        ratio = f"{self.ratio:.1f}x their fused budget" if self.fused_bytes else f"{format_bytes(self.bytes)} against a fused budget of 0 B"
        text = f"{span} ({names}{where}) move {ratio}: fusing them saves {format_bytes(self.excess)}"
        saving = self.saving_s(peak_bandwidth)
        if saving is not None:
            text += f", ~{format_time(saving)}"
            if region_time_s:
                text += f" ({saving / region_time_s:.0%} of this region)"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernels": list(self.kernels),
            "ops": list(self.ops),
            "source": self.source,
            "bytes": self.bytes,
            "fused_bytes": self.fused_bytes,
            "excess": self.excess,
        }


def memory_bound(kernel: Any) -> bool:
    return kernel.op not in _COMPUTE_BOUND and kernel.kind != "copy"


def find_chains(kernels: list[Any], returned: Iterable[tuple] | None = None, *, device_time: bool = False) -> list[Chain]:
    """The chains of ``kernels`` (two kernels or more each), largest excess first.

    ``returned`` holds the storage keys of the call's returned tensors: a chain must
    write those (and what kernels outside it read), and nothing else: an output nobody
    reads (``max``'s indices under ``.values``) is not part of the fused budget. Without
    it (a ``with`` region, whose results are not known), every output the chain does not
    read back itself counts as leaving it.
    """
    returned = set(returned) if returned is not None else None
    candidates = [i for i, k in enumerate(kernels) if (k.reads or k.writes) and k.bytes is not None and memory_bound(k)]
    parent = {i: i for i in candidates}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    writer: dict[tuple, int] = {}  # storage -> the last candidate kernel that wrote it
    for i in candidates:
        for key in kernels[i].reads:
            j = writer.get(key)
            if j is not None:
                parent[find(i)] = find(j)
        for key in kernels[i].writes:
            writer[key] = i
    groups: dict[int, list[int]] = {}
    for i in candidates:
        groups.setdefault(find(i), []).append(i)
    chains = [_chain(kernels, members, returned, device_time) for members in groups.values() if len(members) > 1]
    return sorted(chains, key=lambda c: -c.excess)


def _chain(kernels: list[Any], members: list[int], returned: set | None, device_time: bool) -> Chain:
    inside = set(members)
    external_reads: dict[tuple, int] = {}
    written: dict[tuple, int] = {}
    read_inside_after: dict[tuple, bool] = {}
    for i in members:
        k = kernels[i]
        for key, nbytes in k.reads.items():
            if key in written:
                read_inside_after[key] = True
            else:
                external_reads[key] = max(external_reads.get(key, 0), nbytes)
        for key, nbytes in k.writes.items():
            written[key] = max(written.get(key, 0), nbytes)
            read_inside_after[key] = False  # a later read inside makes it internal again
    read_outside = {key for j, k in enumerate(kernels) if j not in inside and j > members[0] for key in k.reads}
    if returned is None:
        leaves = {key for key in written if not read_inside_after.get(key)}
    else:
        leaves = returned
    external_writes = {key: nbytes for key, nbytes in written.items() if key in leaves or key in read_outside}
    ops = [kernels[i].op for i in members]
    sources = [kernels[i].source for i in members if kernels[i].source]
    return Chain(
        kernels=list(members),
        ops=ops,
        source=sources[0] if sources else None,
        bytes=sum(kernels[i].bytes or 0 for i in members),
        fused_bytes=sum(external_reads.values()) + sum(external_writes.values()),
        time_s=sum(kernels[i].time_s for i in members) if device_time else None,
    )
