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

# Programs run under qemu-user with the host's root as the guest's: the loader
# /lib/ld-linux-aarch64.so.1 and the libraries are those of the multiarch arm64 packages
# (libc6:arm64 comes with libtbb-dev:arm64), so ld.so and libc.so.6 are one glibc build. The
# cross sysroot /usr/aarch64-linux-gnu is for linking only: its ld.so (libc6-arm64-cross) with the
# multiarch libc.so.6 of another Debian revision hangs in the first pthread_create.
find_program(NEEDLE_QEMU_AARCH64 qemu-aarch64)
if(NEEDLE_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${NEEDLE_QEMU_AARCH64} -L /)
endif()
