# Fails if any object in OBJECTS (a ;-separated list) contains an AVX instruction: an operand in a
# %ymm / %zmm register or an AVX-512 mask register %k0-7, a VEX/EVEX-encoded 'v'-prefixed
# mnemonic (vmovss, vfmadd..., vzeroupper, ...) or an AVX-512 mask instruction (kmov..., kand...).
# With -DEXPECT_AVX=1 the test is inverted: it fails unless AVX is found (a control run on the
# per-ISA AVX objects, proving that the detection works).
# Usage: cmake -DOBJECTS="a.o;b.o" [-DEXPECT_AVX=1] -P check_no_avx.cmake
find_program(OBJDUMP NAMES objdump)
if(NOT OBJDUMP)
  message(FATAL_ERROR "objdump not found")
endif()
list(LENGTH OBJECTS n_objects)
if(n_objects EQUAL 0)
  message(FATAL_ERROR "no objects given (-DOBJECTS=...)")
endif()

set(total_insns 0)
set(avx_objects "")
foreach(obj IN LISTS OBJECTS)
  if(NOT EXISTS "${obj}")
    message(FATAL_ERROR "object not found: ${obj}")
  endif()
  execute_process(COMMAND ${OBJDUMP} -d -C --no-show-raw-insn "${obj}"
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "objdump failed on ${obj}: ${err}")
  endif()
  # Instruction lines look like "  1f:\tvmovups (%rdi),%ymm0".
  string(REGEX MATCHALL "\n +[0-9a-f]+:\t[^\n]*" insns "${out}")
  list(LENGTH insns n_insns)
  math(EXPR total_insns "${total_insns} + ${n_insns}")
  set(bad "")
  foreach(line IN LISTS insns)
    string(REGEX REPLACE "^\n +[0-9a-f]+:\t" "" text "${line}")
    # Mnemonic (skipping prefixes such as "rep", "lock", "notrack", "data16", "bnd").
    set(mnem "")
    if(text MATCHES "^((rep[a-z]*|lock|notrack|data16|bnd|ds|cs|addr32) +)*([a-z0-9_.{}]+)")
      set(mnem "${CMAKE_MATCH_3}")
    endif()
    if(text MATCHES "%[yz]mm[0-9]+" OR text MATCHES "%k[0-7]([^0-9]|$)"
       OR (mnem MATCHES "^v" AND NOT mnem MATCHES "^ver[rw]$")
       OR mnem MATCHES "^k(add|and|andn|mov|not|or|ortest|shiftl|shiftr|test|unpck|xnor|xor)[bwdq]")
      list(APPEND bad "${text}")
    endif()
  endforeach()
  list(LENGTH bad n_bad)
  if(n_bad GREATER 0)
    list(APPEND avx_objects "${obj}")
    list(SUBLIST bad 0 5 first)
    list(JOIN first "\n    " shown)
    message(STATUS "${obj}: ${n_bad} AVX instructions, e.g.\n    ${shown}")
  endif()
endforeach()

if(total_insns EQUAL 0)
  message(FATAL_ERROR "objdump listed no instructions in ${n_objects} objects")
endif()
list(LENGTH avx_objects n_avx)
if(EXPECT_AVX)
  if(n_avx EQUAL 0)
    message(FATAL_ERROR "control run: no AVX found in ${n_objects} objects (${total_insns} instructions); "
                        "the detection is broken")
  endif()
  message(STATUS "control run: AVX found in ${n_avx} of ${n_objects} objects, as expected")
else()
  if(n_avx GREATER 0)
    message(FATAL_ERROR "${n_avx} of ${n_objects} baseline objects contain AVX instructions: ${avx_objects}")
  endif()
  message(STATUS "${n_objects} baseline objects, ${total_insns} instructions, no AVX")
endif()
