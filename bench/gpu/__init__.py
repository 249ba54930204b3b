"""The engine on a GPU (issues 20 and 44): gpu_check.sh runs every GPU step in one call of the
device tool (the Triton attention kernels, the engine with CUDA graphs, its other paths)."""
