"""LightPipe: emulation and simulation testbed for pipeline-parallel training across optical DCs."""

from testbed import cpuquirks as _cpuquirks

__version__ = "0.1.0"

# Before anything loads NumPy: its AVX2 kernels are unsafe on a software-emulated CPU.
_cpuquirks.apply()
