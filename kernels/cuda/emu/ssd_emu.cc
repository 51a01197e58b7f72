// The emulated build of kernels/cuda/ssd.cu (see kernels/cuda/launchers.h).
#include "kernels/cuda/ssd.cu"  // NOLINT(build/include): the source itself, compiled for the emulator
