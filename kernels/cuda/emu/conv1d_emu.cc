// The emulated build of kernels/cuda/conv1d.cu (see kernels/cuda/launchers.h).
#include "kernels/cuda/conv1d.cu"  // NOLINT(build/include): the source itself, compiled for the emulator
