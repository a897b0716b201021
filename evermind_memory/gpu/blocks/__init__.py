"""Sequence blocks on the GPU: Mamba-1, Mamba-2, Mamba-3 and causal attention behind one `SequenceLayer`
interface, plus a small stacked `SequenceModel`. These are the WGSL twins: the numpy maths (configs, initial
weights, reference forwards, kernel references) is `evermind_memory.lm.sequence`.

Kernel-level ops are in `sequence_ops.py`; `reference.py` re-exports their numpy twins. Importing this
package does not open a GPU device.
"""

from __future__ import annotations
