// The emulated build of kernels/cuda/matmul.cu (see kernels/cuda/launchers.h).
#include "kernels/cuda/matmul.cu"  // NOLINT(build/include): the source itself, compiled for the emulator
