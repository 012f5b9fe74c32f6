"""Fusion headroom: which memory-bound kernels exchange tensors through HBM, and what
fusing each such chain would save (docs/headroom.md).

Pure logic over ``Kernel`` records: each kernel of an observed op carries the storages it
read and wrote (``Kernel.reads`` / ``Kernel.writes``: storage key -> bytes). Two
memory-bound kernels are in one chain when one reads a storage the other wrote earlier in
the region and their modules allow it (below). A chain's *fused budget* is what one kernel doing its work would move: each
storage it reads before writing it, once, and each storage it writes that leaves the chain
(read by a kernel outside it, returned by the call, or never read again inside it), once.
Its *excess* is what the chain moved beyond that. A kernel is memory-bound unless it is a
GEMM, convolution or attention op (those are compute-bound; they can host an epilogue, but
are never proposed as chain members). Kernels without storages (generated kernels, Triton
launches, CUDA-graph replays) are not chained: their headroom is unknown, not zero.

Chains are cut at module boundaries: a storage links two kernels only when their modules
(``Kernel.module``) are the same or one is the other's direct parent (``layers.0.mlp`` and
``layers.0.mlp.act_fn``; top-level paths, whose parent is the root, all count as one level),
and kernels without a module link only to each other. The residual add in a decoder layer's
forward (``layers.0``) so never glues one layer's norm to the next layer's
(``layers.1.input_layernorm`` is a grandchild). A chain also never holds two kernels of
which the later depends on the earlier through a kernel outside the chain (a GEMM between
them): one fused kernel cannot wait for a GEMM that waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    # The module paths of its kernels, in launch order, each once; empty: kernels without a module.
    modules: list[str] = field(default_factory=list)
    # The chains of the region with the same folded name and ops (itself included): the
    # copies of one repeated fusion, ``layers.*.input_layernorm`` in every layer.
    copies: list["Chain"] = field(default_factory=list, repr=False, compare=False)

    @property
    def module(self) -> str | None:
        """Where the chain sits: its module path, ``layers.0.mlp (with act_fn)`` when its
        kernels are in a module and its direct children; ``None`` without modules."""
        return _module_name(self.modules) if self.modules else None

    @property
    def pattern(self) -> str | None:
        """:attr:`module` with layer indices folded (``layers.*.mlp (with act_fn)``, report.fold_modules)."""
        return _module_name(list(dict.fromkeys(_fold(m) for m in self.modules))) if self.modules else None

    @property
    def leads(self) -> bool:
        """Whether the chain speaks for its copies: it has none, or it is the first."""
        return not self.copies or self.copies[0] is self

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

        span = index_ranges(self.kernels)  # runs, cut after a few: 0-6, 11-17, ... (35 in all)
        names = ", ".join(dict.fromkeys(op.removeprefix("aten::") for op in self.ops))
        where = f"; {self.source}" if self.source else ""
        ratio = f"{self.ratio:.1f}x their fused budget" if self.fused_bytes else f"{format_bytes(self.bytes)} against a fused budget of 0 B"
        saves = format_bytes(self.excess)
        saving = self.saving_s(peak_bandwidth)
        if saving is not None:
            saves += f", ~{format_time(saving)}"
            if region_time_s:
                saves += f" ({saving / region_time_s:.0%} of this region)"
        if not self.modules:
            return f"kernels {span} ({names}{where}) move {ratio}: fusing them saves {saves}"
        text = f"{self.module}: {len(self.kernels)} kernels ({span}: {names}{where}) move {ratio}: fusing them saves {saves}"
        if len(self.copies) > 1:
            total = format_bytes(sum(c.excess for c in self.copies))
            if saving is not None:
                total += f", ~{format_time(sum(c.saving_s(peak_bandwidth) or 0.0 for c in self.copies))}"
            text += f"; {len(self.copies)} copies ({self.pattern}) save {total} in all"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernels": list(self.kernels),
            "ops": list(self.ops),
            "source": self.source,
            "bytes": self.bytes,
            "fused_bytes": self.fused_bytes,
            "excess": self.excess,
            "module": self.module,
            "copies": len(self.copies) or 1,
        }


def memory_bound(kernel: Any) -> bool:
    return kernel.op not in _COMPUTE_BOUND and kernel.kind != "copy"


def find_chains(kernels: list[Any], returned: Iterable[tuple] | None = None, *, device_time: bool = False) -> list[Chain]:
    """The chains of ``kernels`` (two kernels or more each), largest saving first: a
    repeated layer's copies (``Chain.copies``) ranked by what they save together, and
    listed one after another, launch order between equals.

    ``returned`` holds the storage keys of the call's returned tensors: a chain must
    write those (and what kernels outside it read), and nothing else: an output nobody
    reads (``max``'s indices under ``.values``) is not part of the fused budget. Without
    it (a ``with`` region, whose results are not known), every output the chain does not
    read back itself counts as leaving it.
    """
    returned = set(returned) if returned is not None else None
    candidate = [bool(k.reads or k.writes) and k.bytes is not None and memory_bound(k) for k in kernels]
    parent = list(range(len(kernels)))
    members: dict[int, list[int]] = {i: [i] for i, c in enumerate(candidate) if c}  # root -> its kernels
    ancestors = [0] * len(kernels)  # bit j: the kernel depends on kernel j (through any kernels)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def fusable(group: list[int]) -> bool:
        """No kernel of ``group`` waits, through a kernel outside it, on another of it."""
        mask = sum(1 << i for i in group)
        for x in range(group[0] + 1, group[-1]):
            if not mask >> x & 1 and ancestors[x] & mask and any(ancestors[u] >> x & 1 for u in group if u > x):
                return False
        return True

    writer: dict[tuple, int] = {}  # storage -> the last kernel that wrote it (a GEMM too)
    versions: list[dict[tuple, int]] = []  # per kernel: storage read -> its writer (-1: before the region)
    readers: dict[tuple, list[int]] = {}  # (storage, writer) -> the kernels that read that version
    for i, k in enumerate(kernels):
        versions.append({key: writer.get(key, -1) for key in k.reads})
        for key, j in versions[i].items():
            readers.setdefault((key, j), []).append(i)
        sources = sorted({j for j in versions[i].values() if j >= 0})
        for j in sources:
            ancestors[i] |= ancestors[j] | (1 << j)
        if candidate[i]:
            for j in sources:
                if not candidate[j] or not _same_scope(k.module, kernels[j].module):
                    continue
                a, b = find(i), find(j)
                if a == b:
                    continue
                group = sorted(members[a] + members[b])
                if fusable(group):
                    parent[a] = b
                    members[b] = group
                    del members[a]
        for key in k.writes:
            writer[key] = i
    # what the call returns: the last version of each returned storage
    final = None if returned is None else {(key, writer[key]) for key in returned if key in writer}
    chains = [_chain(kernels, group, final, device_time, versions, readers) for group in members.values() if len(group) > 1]
    chains.sort(key=lambda c: c.kernels[0])
    groups: dict[tuple, list[Chain]] = {}
    for chain in chains:
        key = (chain.pattern, tuple(chain.ops)) if chain.modules else (id(chain),)
        groups.setdefault(key, []).append(chain)
    for same in groups.values():
        if len(same) > 1:
            for chain in same:
                chain.copies = same
    # a repeated fusion ranks by what all its copies save; its copies follow each other
    ranked = sorted(groups.values(), key=lambda same: (-sum(c.excess for c in same), same[0].kernels[0]))
    return [chain for same in ranked for chain in sorted(same, key=lambda c: (-c.excess, c.kernels[0]))]


def distinct(chains: list[Chain]) -> list[Chain]:
    """One chain per fusion: the first of each set of copies (its text counts the others)."""
    return [c for c in chains if c.leads]


def _parent(path: str) -> str | None:
    return path.rpartition(".")[0] if "." in path else None  # top level: the root's child


def _same_scope(a: str | None, b: str | None) -> bool:
    """May a tensor from a kernel of module ``a`` to one of module ``b`` join them? Only
    inside one module's forward: the same module, or a module and its direct child. A
    top-level path's parent is the root, named by its class (no dot either), so top-level
    paths join each other."""
    if a is None or b is None:
        return a is None and b is None
    if a == b or _parent(a) == b or _parent(b) == a:
        return True
    return _parent(a) is None and _parent(b) is None


def _fold(path: str) -> str:
    from .report import fold_modules

    return fold_modules([(path, 0.0, 0)])[0][0]  # layers.3.mlp -> layers.*.mlp


def _module_name(paths: list[str]) -> str:
    """``layers.0.mlp (with act_fn)``: the paths' common ancestor when it is one of them,
    the others relative to it; otherwise the paths joined by `` + ``."""
    parts = [p.split(".") for p in paths]
    common: list[str] = []
    for level in zip(*parts):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    top = ".".join(common)
    if len(paths) == 1 or top not in paths:
        return " + ".join(paths)
    return f"{top} (with {', '.join(p[len(top) + 1:] for p in paths if p != top)})"


def _chain(
    kernels: list[Any],
    members: list[int],
    final: set | None,
    device_time: bool,
    versions: list[dict[tuple, int]],
    readers: dict[tuple, list[int]],
) -> Chain:
    """Storages are told apart by version (storage, the kernel that wrote it): the
    allocator hands a freed address to the next tensor, and a chain reading ``gate_proj``'s
    output and then ``up_proj``'s at the same address reads two tensors."""
    inside = set(members)
    external_reads: dict[tuple, int] = {}
    external_writes: dict[tuple, int] = {}
    for i in members:
        k = kernels[i]
        for key, nbytes in k.reads.items():
            version = (key, versions[i][key])
            if version[1] not in inside:
                external_reads[version] = max(external_reads.get(version, 0), nbytes)
        for key, nbytes in k.writes.items():
            read_by = readers.get((key, i), ())
            if final is None:
                leaves = not any(j in inside for j in read_by)  # a region: whatever it does not read back
            else:
                leaves = (key, i) in final
            if leaves or any(j not in inside for j in read_by):
                external_writes[(key, i)] = max(external_writes.get((key, i), 0), nbytes)
    ops = [kernels[i].op for i in members]
    sources = [kernels[i].source for i in members if kernels[i].source]
    return Chain(
        kernels=list(members),
        ops=ops,
        source=sources[0] if sources else None,
        bytes=sum(kernels[i].bytes or 0 for i in members),
        fused_bytes=sum(external_reads.values()) + sum(external_writes.values()),
        time_s=sum(kernels[i].time_s for i in members) if device_time else None,
        modules=list(dict.fromkeys(kernels[i].module for i in members if kernels[i].module is not None)),
    )
