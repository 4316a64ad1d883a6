"""edge: run large language models on the CPU, iGPU and NPU in front of you."""

from __future__ import annotations

__version__ = "0.1.0"
