"""Compiler options for hybridserve's own code (not for system libraries)."""

# Warnings are errors in our code; -Wthread-safety checks abseil's
# ABSL_GUARDED_BY / ABSL_LOCKS_EXCLUDED annotations at compile time.
HS_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
    "-Wno-sign-compare",
    "-Wthread-safety",
    "-Werror",
]

# Generated protobuf/gRPC sources: no -Werror (we do not own their warnings).
HS_GENERATED_COPTS = ["-Wno-unused-parameter"]
