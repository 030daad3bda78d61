# The fake device (tests/gpu/fake/README.md): the CUDA runtime, cuBLAS and NCCL of the CPU
# emulation (tests/gpu/emu) built as libcudart.so.<major>, libcublas.so.<major> and
# libnccl.so.<major>, with the toolkit's headers for their ABI and its libraries' symbol
# versions, and the .cu kernels rewritten into C++ (cu2cpp) instead of compiled by nvcc.
# Included by cmake/StarpipeCuda.cmake with -DSTARPIPE_FAKE_GPU=ON, in place of nvcc and
# the toolkit's libraries. Gives the targets CUDA::cudart, CUDA::cublas, NCCL::nccl (the
# fake ones, in <build>/fake-device/, found by every binary of the build through its RPATH)
# and starpipe_cuda_kernels; the StarPU built with CUDA loads the fake libraries by their
# sonames.
include(CheckLanguage)
check_language(CXX)
if(NOT CMAKE_CXX_COMPILER)
  message(FATAL_ERROR "STARPIPE_FAKE_GPU: needs a C++ compiler (Debian: g++)")
endif()
enable_language(CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)

set(_sp_emu ${CMAKE_SOURCE_DIR}/tests/gpu/emu)
set(_sp_fake ${CMAKE_SOURCE_DIR}/tests/gpu/fake)
set(STARPIPE_FAKE_GPU_DIR ${CMAKE_BINARY_DIR}/fake-device)

# --- the toolkit's headers: the ABI the fake libraries must have ---
find_path(STARPIPE_CUDA_INCLUDE_DIR cuda_runtime_api.h
          HINTS $ENV{CUDA_HOME}/include /usr/local/cuda/include)
find_path(NCCL_INCLUDE_DIR nccl.h HINTS $ENV{NCCL_HOME}/include ${STARPIPE_CUDA_INCLUDE_DIR})
if(NOT STARPIPE_CUDA_INCLUDE_DIR OR NOT EXISTS ${STARPIPE_CUDA_INCLUDE_DIR}/cublas_v2.h)
  message(FATAL_ERROR "STARPIPE_FAKE_GPU: the CUDA toolkit's headers (cuda_runtime_api.h, "
    "cublas_v2.h) were not found; set CUDA_HOME")
endif()
function(_sp_header_number out file regex)
  file(STRINGS ${file} _l REGEX "${regex}")
  string(REGEX REPLACE ".*${regex}([0-9]+).*" "\\1" _n "${_l}")
  set(${out} ${_n} PARENT_SCOPE)
endfunction()
_sp_header_number(_sp_cudart_v ${STARPIPE_CUDA_INCLUDE_DIR}/cuda_runtime_api.h
                  "#define CUDART_VERSION +")
_sp_header_number(_sp_cublas_major ${STARPIPE_CUDA_INCLUDE_DIR}/cublas_api.h
                  "#define CUBLAS_VER_MAJOR +")
math(EXPR _sp_cudart_major "${_sp_cudart_v} / 1000")
set(CUDAToolkit_VERSION "${_sp_cudart_major} (fake device)")
set(CUDAToolkit_LIBRARY_DIR ${STARPIPE_FAKE_GPU_DIR})
set(CUDAToolkit_BIN_DIR "")
find_package(MPI COMPONENTS C REQUIRED)
find_package(Threads REQUIRED)

# --- the libraries ---
file(MAKE_DIRECTORY ${STARPIPE_FAKE_GPU_DIR})
# sp_fake_library(target name soversion version-node sources...): lib<name>.so.<soversion>
# in fake-device/, every symbol under version-node (none: unversioned, as NCCL's).
function(sp_fake_library target name soversion node)
  add_library(${target} SHARED ${ARGN})
  set_target_properties(${target} PROPERTIES OUTPUT_NAME ${name} SOVERSION ${soversion}
                        LIBRARY_OUTPUT_DIRECTORY ${STARPIPE_FAKE_GPU_DIR})
  target_include_directories(${target} PRIVATE ${_sp_emu}
                             PUBLIC ${STARPIPE_CUDA_INCLUDE_DIR})
  # SP_EMU_STRICT: device pointers must be device memory
  target_compile_definitions(${target} PRIVATE SP_EMU_STRICT)
  target_compile_options(${target} PRIVATE -Wno-deprecated-declarations)
  if(node)
    set(_map ${STARPIPE_FAKE_GPU_DIR}/${name}.map)
    file(WRITE ${_map} "${node} { global: *; };\n")
    target_link_options(${target} PRIVATE LINKER:--version-script=${_map})
  endif()
endfunction()

# The SIMT scheduler is compiled against the emulation's own headers (simt.h), the rest
# against the toolkit's; the two meet in tests/gpu/emu/emu.h.
add_library(starpipe_fake_simt OBJECT ${_sp_emu}/simt.cpp)
target_include_directories(starpipe_fake_simt PRIVATE ${_sp_emu} ${_sp_emu}/include)
target_compile_definitions(starpipe_fake_simt PRIVATE SP_EMU_STRICT)
set_target_properties(starpipe_fake_simt PROPERTIES POSITION_INDEPENDENT_CODE ON)

sp_fake_library(starpipe_fake_cudart cudart ${_sp_cudart_major} libcudart.so.${_sp_cudart_major}
                ${_sp_emu}/runtime.cpp ${_sp_emu}/devmem.cpp $<TARGET_OBJECTS:starpipe_fake_simt>)
target_link_libraries(starpipe_fake_cudart PRIVATE Threads::Threads)
sp_fake_library(starpipe_fake_cublas cublas ${_sp_cublas_major} libcublas.so.${_sp_cublas_major}
                ${_sp_emu}/cublas.cpp)
target_link_libraries(starpipe_fake_cublas PUBLIC starpipe_fake_cudart PRIVATE PkgConfig::OPENBLAS)
add_library(CUDA::cudart ALIAS starpipe_fake_cudart)
add_library(CUDA::cublas ALIAS starpipe_fake_cublas)

if(STARPIPE_NCCL)
  if(NOT NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "STARPIPE_FAKE_GPU: nccl.h not found; set NCCL_HOME, or configure "
      "with -DSTARPIPE_NCCL=OFF")
  endif()
  _sp_header_number(_sp_nccl_major ${NCCL_INCLUDE_DIR}/nccl.h "#define NCCL_MAJOR +")
  sp_fake_library(starpipe_fake_nccl nccl ${_sp_nccl_major} "" ${_sp_fake}/nccl.cpp)
  target_include_directories(starpipe_fake_nccl PUBLIC ${NCCL_INCLUDE_DIR})
  target_link_libraries(starpipe_fake_nccl PUBLIC starpipe_fake_cudart PRIVATE MPI::MPI_C)
  # the C API of MPI only, from C++
  target_compile_definitions(starpipe_fake_nccl PRIVATE OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  add_library(NCCL::nccl ALIAS starpipe_fake_nccl)
  set(NCCL_LIBRARY ${STARPIPE_FAKE_GPU_DIR}/libnccl.so.${_sp_nccl_major})
  add_compile_definitions(STARPIPE_HAVE_NCCL=1)
endif()
add_compile_definitions(STARPIPE_HAVE_CUDA=1)

# --- the kernels: codelets/cuda/*.cu rewritten into C++ on the SIMT emulation, as in
# tests/gpu/emu (the same flags), their launches and cuBLAS calls into the libraries above.
# The emulation's headers come first for them only; the C code of starpipe sees the
# toolkit's. Linked into C programs: the C++ runtime comes along. ---
include(${_sp_emu}/Cu2cpp.cmake)
sp_cu2cpp(_sp_fake_cpp ${STARPIPE_FAKE_GPU_DIR}/cu)
add_library(starpipe_cuda_kernels STATIC ${_sp_fake_cpp} ${CMAKE_SOURCE_DIR}/codelets/cuda/backend.c)
# (the kernels only: the table, backend.c, is C against the toolkit's headers)
target_include_directories(starpipe_cuda_kernels BEFORE PRIVATE
                           $<$<COMPILE_LANGUAGE:CXX>:${_sp_emu}/include> $<$<COMPILE_LANGUAGE:CXX>:${_sp_emu}>)
target_include_directories(starpipe_cuda_kernels PUBLIC ${CMAKE_SOURCE_DIR}/include
                           ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/codelets/cuda)
target_compile_definitions(starpipe_cuda_kernels PRIVATE SP_EW_MAX_BLOCKS=64)
target_compile_options(starpipe_cuda_kernels PRIVATE -ffp-contract=off -Wno-sign-compare
                       -Wno-unknown-pragmas)
target_link_libraries(starpipe_cuda_kernels PUBLIC CUDA::cudart CUDA::cublas)
target_link_libraries(starpipe_fake_cudart INTERFACE stdc++)
message(STATUS "starpipe CUDA: the fake device (tests/gpu/fake): libcudart.so.${_sp_cudart_major}, "
  "libcublas.so.${_sp_cublas_major}, libnccl.so.${_sp_nccl_major} in ${STARPIPE_FAKE_GPU_DIR}, "
  "headers of ${STARPIPE_CUDA_INCLUDE_DIR}; StarPU ${_sp_prefix}")
