// The emulated build of kernels/cuda/attention.cu (see kernels/cuda/launchers.h).
#include "kernels/cuda/attention.cu"  // NOLINT(build/include): the source itself, compiled for the emulator
