"""The FAKE pynvml (tests/fakes/fake_pynvml.py) against the real nvidia-ml-py module: every
function the fake offers exists in the real ``pynvml`` with the same parameters, every
constant has the real value, every error class the real name, parent, ``value`` and text.
Nothing here calls the real library (no driver on CPU machines): only its Python surface."""

import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

from tests.fakes import fake_pynvml

pytestmark = pytest.mark.fake_gpu

FAKES = str(Path(fake_pynvml.__file__).resolve().parent / "pynvml_path")


@pytest.fixture(scope="module")
def real():
    """nvidia-ml-py's own ``pynvml``, loaded from site-packages even where the fake's shim is
    on the path (the fake never answers for it)."""
    paths = [p for p in sys.path if Path(p or ".").resolve() != Path(FAKES)]
    spec = importlib.machinery.PathFinder.find_spec("pynvml", paths)
    if spec is None:
        pytest.skip("nvidia-ml-py is not installed (pip install -e '.[train]')")
    module = importlib.util.module_from_spec(spec)
    before = sys.modules.get("pynvml")
    sys.modules["pynvml"] = module  # the module looks itself up there while it loads
    try:
        spec.loader.exec_module(module)
    finally:
        if before is None:
            sys.modules.pop("pynvml")
        else:
            sys.modules["pynvml"] = before
    assert "fake" not in (module.__doc__ or "").lower() + module.__file__
    return module


def _functions():
    return [
        n
        for n, f in vars(fake_pynvml).items()
        if n.startswith("nvml") and inspect.isfunction(f) and f.__module__ == fake_pynvml.__name__
    ]


def test_fake_functions_exist_in_the_real_module_with_its_parameters(real):
    for name in _functions():
        assert hasattr(real, name), f"{name}: not a pynvml function"
        want = inspect.signature(getattr(real, name)).parameters
        got = inspect.signature(getattr(fake_pynvml, name)).parameters
        assert list(got) == list(want), f"{name}{tuple(got)}: pynvml has {tuple(want)}"
        defaults = {k: p.default for k, p in want.items()}
        assert {k: p.default for k, p in got.items()} == defaults, name


def test_fake_constants_have_the_real_values(real):
    names = [n for n in vars(fake_pynvml) if n.startswith(("NVML_", "nvml")) and n.isupper()]
    names += [n for n in vars(fake_pynvml) if n.startswith("NVML_")]
    for name in sorted(set(names)):
        if name == "NVML_GPM_METRICS_GET_VERSION":  # a ctypes-version word the fake never checks
            continue
        assert getattr(real, name) == getattr(fake_pynvml, name), name


def test_fake_error_classes_behave_as_the_real_ones(real):
    errors = [n for n in vars(fake_pynvml) if n.startswith("NVMLError_")]
    assert {"NVMLError_NoPermission", "NVMLError_NotFound", "NVMLError_InvalidArgument"} <= set(
        errors
    )
    for name in errors:
        fake_cls, real_cls = getattr(fake_pynvml, name), getattr(real, name)
        fake_e, real_e = fake_cls(), real_cls()
        assert fake_e.value == real_e.value, name
        assert str(fake_e) == str(real_e), name  # the texts a user reads in our messages
        # NVMLError(value) is the subclass, in both: `except NVMLError_NoPermission` catches it
        assert type(fake_pynvml.NVMLError(fake_e.value)) is fake_cls
        assert type(real.NVMLError(real_e.value)) is real_cls
        assert issubclass(fake_cls, fake_pynvml.NVMLError)


def test_deprecated_calls_are_the_ones_the_real_module_deprecates(real):
    """The calls wattflex moved off (nvidia-ml-py: "will be removed in CUDA 14.0") and their
    successors, as the real module's source says."""
    source = inspect.getsource(real)
    for old, new in (
        ("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperatureV"),
        ("nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetCurrentClocksEventReasons"),
    ):
        line = source[: source.index(f"def {old}(")].rstrip().splitlines()[-1]
        assert "DEPRECATED" in line and new in line and "CUDA 14.0" in line, line


def test_fake_units_match_the_real_structures(real):
    """Power in mW, energy in mJ, memory in bytes, PCI bus ids in NVML's format: the real
    structures' fields are what the fake's answers carry."""
    fake_pynvml.reset(n_gpus=1)
    pci = fake_pynvml.nvmlDeviceGetPciInfo(0)
    fields = {f for f, _ in real.nvmlPciInfo_t._fields_}
    assert {"busId", "busIdLegacy", "domain", "bus", "device"} <= fields
    assert pci.busId.decode() == real.NVML_DEVICE_PCI_BUS_ID_FMT % (pci.domain, pci.bus, 0)
    assert {f for f, _ in real.c_nvmlMemory_t._fields_} >= set(
        vars(fake_pynvml.nvmlDeviceGetMemoryInfo(0))
    )
    assert {f for f, _ in real.c_nvmlUtilization_t._fields_} == set(
        vars(fake_pynvml.nvmlDeviceGetUtilizationRates(0))
    )
    lo, hi = fake_pynvml.nvmlDeviceGetPowerManagementLimitConstraints(0)
    assert 100_000 <= lo < hi <= 2_000_000  # mW: a 100-2000 W board
