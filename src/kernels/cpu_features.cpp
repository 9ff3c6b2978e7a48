#include "kernels/cpu_features.h"

#include <cstring>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace needle {
namespace {

CpuFeatures detect() {
    CpuFeatures f;
#if defined(__aarch64__)
    f.neon = true;
#if defined(__linux__)  // includes Android (getauxval since API level 18)
    // Bit numbers of the Linux arm64 ABI (arch/arm64/include/uapi/asm/hwcap.h), spelled out so
    // that older libc or NDK headers do not matter.
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    f.neon = (hw & (1ul << 1)) != 0;      // HWCAP_ASIMD
    f.asimdhp = (hw & (1ul << 10)) != 0;  // HWCAP_ASIMDHP
    f.asimddp = (hw & (1ul << 20)) != 0;  // HWCAP_ASIMDDP
    f.sve = (hw & (1ul << 22)) != 0;      // HWCAP_SVE
    f.sve2 = (hw2 & (1ul << 1)) != 0;     // HWCAP2_SVE2
    f.i8mm = (hw2 & (1ul << 13)) != 0;    // HWCAP2_I8MM
    f.bf16 = (hw2 & (1ul << 14)) != 0;    // HWCAP2_BF16
#endif
#endif
    return f;
}

}  // namespace

const CpuFeatures &cpu_features() {
    static const CpuFeatures f = detect();
    return f;
}

const char *cpu_feature_names() {
    static const char *const names = [] {
        static char buf[96] = "";
        const CpuFeatures &f = cpu_features();
        const struct {
            bool on;
            const char *name;
        } all[] = {{f.neon, "neon"}, {f.asimddp, "asimddp"}, {f.asimdhp, "asimdhp"}, {f.i8mm, "i8mm"},
                   {f.bf16, "bf16"}, {f.sve, "sve"},         {f.sve2, "sve2"}};
        for (const auto &a : all)
            if (a.on) {
                if (buf[0]) std::strcat(buf, " ");
                std::strcat(buf, a.name);
            }
        return buf;
    }();
    return names;
}

}  // namespace needle
