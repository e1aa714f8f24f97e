"""Fakes of hardware boundaries (only the GPU's NVML library; everything else in tests is real)."""
