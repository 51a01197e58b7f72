// The emulated build of kernels/cuda/elementwise.cu (see kernels/cuda/launchers.h).
#include "kernels/cuda/elementwise.cu"  // NOLINT(build/include): the source itself, compiled for the emulator
