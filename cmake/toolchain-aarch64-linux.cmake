# Cross build for aarch64 Linux with Debian's cross toolchain and multiarch arm64 packages
# (scripts/cross-arm64.sh installs them):
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64-linux.cmake
# Tests, the doctest test discovery and the build-time demo model run under qemu-user.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(NEEDLE_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${NEEDLE_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${NEEDLE_CROSS_TRIPLE}-g++)
# Debian multiarch: find_package looks in /usr/lib/aarch64-linux-gnu/cmake (libtbb-dev:arm64),
# never in the x86-64 folder; header-only packages (xsimd, doctest, nlohmann-json) come from
# /usr/include and /usr/share as in a native build.
set(CMAKE_LIBRARY_ARCHITECTURE ${NEEDLE_CROSS_TRIPLE})

# The arm64 sysroot of the cross libc; libraries installed as :arm64 live in
# /usr/lib/aarch64-linux-gnu, which the guest's loader does not search by itself.
set(NEEDLE_CROSS_SYSROOT /usr/${NEEDLE_CROSS_TRIPLE})
find_program(NEEDLE_QEMU_AARCH64 qemu-aarch64)
if(NEEDLE_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${NEEDLE_QEMU_AARCH64} -L ${NEEDLE_CROSS_SYSROOT}
      -E LD_LIBRARY_PATH=/usr/lib/${NEEDLE_CROSS_TRIPLE}:/lib/${NEEDLE_CROSS_TRIPLE})
endif()
