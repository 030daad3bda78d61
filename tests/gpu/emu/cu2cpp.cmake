# Turns one .cu file of codelets/cuda into C++ for the CPU emulation, at build time:
#   cmake -DIN=codelets/cuda/x.cu -DOUT=.../x.cpp -P cu2cpp.cmake
# Each launch k<<<grid, block[, shared[, stream]]>>>(args) becomes
# SP_LAUNCH(k, grid, block[, shared[, stream]])(args) (simt.h); the rest is the file as
# written, and #line points diagnostics at it. Fails when a launch is left unrewritten.
if(NOT IN OR NOT OUT)
  message(FATAL_ERROR "usage: cmake -DIN=file.cu -DOUT=file.cpp -P cu2cpp.cmake")
endif()
file(READ "${IN}" src)
# One character each for <<< and >>>, so that a launch configuration is [^close]*.
string(ASCII 1 open)
string(ASCII 2 close)
string(FIND "${src}" "${open}" o)
string(FIND "${src}" "${close}" c)
if(NOT o EQUAL -1 OR NOT c EQUAL -1)
  message(FATAL_ERROR "${IN}: holds the control characters 1 or 2, which cu2cpp.cmake uses")
endif()
string(REPLACE "<<<" "${open}" src "${src}")
string(REPLACE ">>>" "${close}" src "${src}")
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*)[ \t\r\n]*${open}([^${close}]*)${close}"
       "SP_LAUNCH(\\1, \\2)" src "${src}")
string(FIND "${src}" "${open}" o)
string(FIND "${src}" "${close}" c)
if(NOT o EQUAL -1 OR NOT c EQUAL -1)
  message(FATAL_ERROR "${IN}: a kernel launch cu2cpp.cmake cannot rewrite (a template "
    "kernel, or <<< without >>>): teach it, see tests/gpu/emu/README.md")
endif()
file(WRITE "${OUT}.tmp" "#include \"simt.h\"\n#line 1 \"${IN}\"\n${src}")
file(RENAME "${OUT}.tmp" "${OUT}")
