// The emulated build of kernels/cuda/cuda_backend.cu (see kernels/cuda/launchers.h).
#include "kernels/cuda/cuda_backend.cu"  // NOLINT(build/include): the source itself, compiled for the emulator
