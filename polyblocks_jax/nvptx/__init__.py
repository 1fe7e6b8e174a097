"""The NVIDIA target (PTX through NVVM, CUDA driver runtime): not built yet; see issue 7."""
