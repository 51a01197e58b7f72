// The emulated build of kernels/cuda/moe.cu (see kernels/cuda/launchers.h).
#include "kernels/cuda/moe.cu"  // NOLINT(build/include): the source itself, compiled for the emulator
