"""Sequence blocks on the GPU: Mamba-1, Mamba-2, Mamba-3 and causal attention behind one `SequenceLayer`
interface, plus a small stacked `SequenceModel`; every block has a numpy reference forward.

Kernel-level ops and their numpy twins are in `sequence_ops.py` and `reference.py`. Importing this package
does not open a GPU device.
"""

from __future__ import annotations
