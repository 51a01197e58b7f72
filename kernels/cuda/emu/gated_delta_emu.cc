// The emulated build of kernels/cuda/gated_delta.cu (see kernels/cuda/launchers.h).
#include "kernels/cuda/gated_delta.cu"  // NOLINT(build/include): the source itself, compiled for the emulator
