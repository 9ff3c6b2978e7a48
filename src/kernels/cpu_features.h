// What the CPU (as the OS reports it) offers beyond each architecture's baseline, detected once
// per process, so a kernel path needing more than the baseline can be chosen at run time
// (dispatch.cpp). aarch64: NEON (ASIMD) is baseline; the dot-product (asimddp, SDOT/UDOT), int8
// matrix multiply (i8mm), half-precision arithmetic (asimdhp), bf16 and SVE/SVE2 are not, and
// Linux and Android report them in getauxval(AT_HWCAP / AT_HWCAP2). Elsewhere (macOS/iOS would
// ask sysctlbyname("hw.optional.arm.FEAT_DotProd"), not built here) only the baseline is claimed.
#pragma once

namespace needle {

struct CpuFeatures {
    // aarch64 (all false on other architectures)
    bool neon = false;     // ASIMD: always true on aarch64
    bool asimddp = false;  // SDOT / UDOT (Armv8.2 dot product)
    bool asimdhp = false;  // FP16 vector arithmetic
    bool i8mm = false;     // SMMLA / USDOT (Armv8.6 int8 matrix multiply)
    bool bf16 = false;
    bool sve = false, sve2 = false;
};

// Detected on first call; thread-safe.
const CpuFeatures &cpu_features();

// The features present as space-separated names in the order of the struct ("neon asimddp"),
// "" when none: for tests and diagnostics (the library prints nothing).
const char *cpu_feature_names();

}  // namespace needle
