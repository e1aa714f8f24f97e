"""Devices a real run talks to: the common interface and telemetry sampler (``base``), NVML
GPUs (``nvml``), DCGM fields read live through ``dcgmi dmon`` or dcgm-exporter
(``dcgm_sampler``), cap setting with a restore that survives kills (``caps``, its state files in
``cap_state``), SM clock locks (``clocks``), host power from RAPL (``hostpower``) and the sudo
wrapper that lets a user cap their own job's GPUs (``setcap``). Only ``nvml`` imports pynvml,
lazily.
"""

import lazy_loader

# The names this package hands on are those __init__.pyi imports; each is imported from its
# module on first use (PEP 562 ``__getattr__``, lazy_loader), so importing the package (as
# ``wattflex --help`` does) imports none of them.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
