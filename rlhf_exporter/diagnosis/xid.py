"""NVIDIA XID codes: which the exporter labels by code, and which mean a bad GPU.

Pure data (no I/O). From NVIDIA's "XID Errors" catalog (docs.nvidia.com/deploy/xid-errors)
and the actions it gives per code; the table and the reasoning are in docs/dcgm-exporter.md.

- `LABELLED`: codes exported as their own `xid` label value; any other code is counted as
  `xid="other"` (the label set stays bounded whatever the driver reports).
- `BAD_GPU`: the GPU (or its memory, or its link) is broken or needs a reset / drain: the job
  on it will not recover by itself. RLHFGPUBadXid pages on these.
- `LOST`: the GPU fell off the bus (79): NVML then answers GpuIsLost for it, which
  RLHFGPULost pages on; counted, never a second page for the same fact.
- `DEGRADED`: hardware-reported, the GPU keeps working but needs attention at the next
  maintenance (a row remap recorded, a high correctable-error rate, a contained ECC error
  that killed one application).
- `APPLICATION`: raised by what the program did (illegal address, a killed context, an
  engine exception after a bad kernel): ignorable for GPU health; the job's own alerts (stall,
  actor deaths) cover them.
"""

from __future__ import annotations

BAD_GPU: frozenset[int] = frozenset(
    {
        48,  # double-bit ECC error (DBE)
        62,  # internal micro-controller halt
        64,  # ECC page retirement or row remapping recording failure
        74,  # NVLink error
        95,  # uncontained ECC error (GPU reset required)
        119,  # GSP RPC timeout
        120,  # GSP error
        140,  # unrecovered ECC error
    }
)
LOST: frozenset[int] = frozenset({79})  # GPU has fallen off the bus: RLHFGPULost
DEGRADED: frozenset[int] = frozenset(
    {
        63,  # ECC page retirement or row remapping recording event (reset to apply)
        92,  # high single-bit ECC error rate
        94,  # contained ECC error (the application using the bad memory was killed)
    }
)
APPLICATION: frozenset[int] = frozenset(
    {
        13,  # graphics engine exception (usually an illegal instruction or address)
        31,  # GPU memory page fault (usually an illegal address in the application)
        43,  # GPU stopped processing (the context was killed)
        45,  # preemptive cleanup after a previous error (a killed process)
        68,  # video decoder exception
        69,  # graphics engine class error
    }
)
LABELLED: frozenset[int] = BAD_GPU | LOST | DEGRADED | APPLICATION
OTHER = "other"


def xid_label(code: int) -> str:
    """The `xid` label of an XID code: its number when in LABELLED, else "other"."""
    return str(code) if code in LABELLED else OTHER


def regex(codes: frozenset[int]) -> str:
    """A PromQL regex matching the labels of `codes`."""
    return "|".join(str(c) for c in sorted(codes))
