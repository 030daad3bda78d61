# The CUDA build (STARPIPE_CUDA): a StarPU 1.3 built with CUDA and MPI
# (scripts/build-starpu-cuda), the CUDA kernels (codelets/cuda/*.cu), cuBLAS and NCCL.
# Included by the top-level CMakeLists.txt before it looks up StarPU; with
# STARPIPE_CUDA OFF (the default) it changes nothing.
#
#   cmake -S . -B build-cuda -DSTARPIPE_STARPU_PREFIX=$PWD/build/starpu-cuda
#
# With -DSTARPIPE_FAKE_GPU=ON the same build runs without a GPU: no nvcc, and the fake
# device of tests/gpu/fake (the CPU emulation as libcudart, libcublas and libnccl with the
# real sonames) in place of the toolkit's libraries (`make test` builds one in
# build/fake-gpu).
#
# Gives: STARPIPE_HAVE_CUDA=1 (and STARPIPE_HAVE_NCCL=1) for all code, the targets
# starpipe_cuda_kernels (codelets/cuda: the .cu kernels and backend.c, their table) and
# NCCL::nccl, starpipe_cuda_link(target) (called by comm/ and runtime/)
# and starpipe_cuda_tests().

set(STARPIPE_STARPU_PREFIX "" CACHE PATH
    "Install folder of the StarPU to build with: a StarPU 1.3 built with CUDA (scripts/build-starpu-cuda; implies STARPIPE_CUDA) or a CPU-only StarPU 1.4 (scripts/build-starpu-1.4; cmake/StarpipeStarpu.cmake)")
set(_sp_cuda_default OFF)
if(STARPIPE_STARPU_PREFIX)
  # a prefix implies CUDA unless its StarPU says it has none (scripts/build-starpu-1.4's)
  set(_sp_cuda_default ON)
  file(GLOB _sp_cfgs "${STARPIPE_STARPU_PREFIX}/include/starpu/*/starpu_config.h")
  if(_sp_cfgs)
    list(GET _sp_cfgs 0 _sp_cfg)
    file(STRINGS ${_sp_cfg} _sp_use_cuda REGEX "^#define STARPU_USE_CUDA 1")
    if(NOT _sp_use_cuda)
      set(_sp_cuda_default OFF)
    endif()
  endif()
endif()
option(STARPIPE_CUDA "Build with CUDA: the CUDA StarPU, the .cu kernels, cuBLAS, NCCL" ${_sp_cuda_default})
option(STARPIPE_NCCL "With STARPIPE_CUDA: link NCCL (found in the CUDA toolkit or NCCL_HOME)" ON)
option(STARPIPE_FAKE_GPU "With STARPIPE_CUDA: run on the fake device of tests/gpu/fake (CPU emulation behind the CUDA, cuBLAS and NCCL ABIs) instead of nvcc and the toolkit's libraries" OFF)
if(NOT STARPIPE_CUDA)
  return()
endif()
if(NOT STARPIPE_WITH_STARPU)
  message(FATAL_ERROR "STARPIPE_CUDA needs the StarPU runtime (STARPIPE_WITH_STARPU=ON)")
endif()

# --- the CUDA StarPU: its pkg-config files come first, whatever else pkg-config knows ---
if(NOT STARPIPE_STARPU_PREFIX)
  foreach(_p ${CMAKE_SOURCE_DIR}/build/starpu-cuda ${CMAKE_SOURCE_DIR}/.gpu-deps/starpu)
    if(EXISTS ${_p}/lib/pkgconfig/starpu-1.3.pc)
      set(STARPIPE_STARPU_PREFIX ${_p} CACHE PATH "" FORCE)
      break()
    endif()
  endforeach()
endif()
get_filename_component(_sp_prefix "${STARPIPE_STARPU_PREFIX}" ABSOLUTE)
set(_sp_config ${_sp_prefix}/include/starpu/1.3/starpu_config.h)
if(NOT STARPIPE_STARPU_PREFIX OR NOT EXISTS ${_sp_prefix}/lib/pkgconfig/starpu-1.3.pc
   OR NOT EXISTS ${_sp_config})
  message(FATAL_ERROR "STARPIPE_CUDA: no StarPU in '${STARPIPE_STARPU_PREFIX}'. Build one with "
    "scripts/build-starpu-cuda [PREFIX] and pass -DSTARPIPE_STARPU_PREFIX=PREFIX")
endif()
file(STRINGS ${_sp_config} _sp_use_cuda REGEX "^#define STARPU_USE_CUDA 1")
file(STRINGS ${_sp_config} _sp_use_mpi REGEX "^#define STARPU_USE_MPI 1")
if(NOT _sp_use_cuda OR NOT _sp_use_mpi)
  message(FATAL_ERROR "STARPIPE_CUDA: the StarPU in ${_sp_prefix} lacks CUDA or MPI "
    "(starpu_config.h); rebuild it with scripts/build-starpu-cuda")
endif()
set(STARPIPE_STARPU_LIBDIR ${_sp_prefix}/lib)
set(ENV{PKG_CONFIG_PATH} "${_sp_prefix}/lib/pkgconfig:$ENV{PKG_CONFIG_PATH}")
# pkg_check_modules caches its answer: look StarPU up again on every configure
unset(__pkg_config_checked_STARPU CACHE)
unset(__pkg_config_checked_STARPUMPI CACHE)
# libstarpu of the CPU-only system StarPU has the same soname: an RPATH (not RUNPATH,
# which LD_LIBRARY_PATH and the ld.so cache can override for indirect loads) to ours.
list(APPEND CMAKE_BUILD_RPATH ${STARPIPE_STARPU_LIBDIR})
list(APPEND CMAKE_INSTALL_RPATH ${STARPIPE_STARPU_LIBDIR})
add_link_options(LINKER:--disable-new-dtags)

if(STARPIPE_FAKE_GPU)
  include(${CMAKE_SOURCE_DIR}/tests/gpu/fake/FakeGpu.cmake)
else()
  # --- CUDA language: sm_90 SASS + compute_90 PTX (H100/H200; newer parts JIT the PTX) ---
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(_sp_nvcc nvcc HINTS $ENV{CUDA_HOME}/bin /usr/local/cuda/bin)
    if(_sp_nvcc)
      set(CMAKE_CUDA_COMPILER ${_sp_nvcc})
    endif()
  endif()
  # One CUDA runtime in the process: StarPU uses the shared libcudart, so do we.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # nvcc does not take gcc's warning flags (set by add_compile_options above): hand them to
  # the host compiler for .cu files, unchanged for C.
  get_directory_property(_sp_opts COMPILE_OPTIONS)
  set(_sp_wrapped "")
  foreach(_o ${_sp_opts})
    list(APPEND _sp_wrapped "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_o}>"
                            "$<$<NOT:$<COMPILE_LANGUAGE:CUDA>>:${_o}>")
  endforeach()
  set_directory_properties(PROPERTIES COMPILE_OPTIONS "${_sp_wrapped}")
  add_compile_definitions(STARPIPE_HAVE_CUDA=1)

  # --- NCCL: next to the toolkit (pip-style /usr/local/cuda/lib) or NCCL_HOME ---
  if(STARPIPE_NCCL)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS $ENV{NCCL_HOME}/include ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS $ENV{NCCL_HOME}/lib ${CUDAToolkit_LIBRARY_DIR}
                 ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_ROOT}/lib64)
    if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
      message(FATAL_ERROR "STARPIPE_CUDA: NCCL not found (nccl.h: ${NCCL_INCLUDE_DIR}, "
        "libnccl: ${NCCL_LIBRARY}); set NCCL_HOME, or configure with -DSTARPIPE_NCCL=OFF")
    endif()
    file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _sp_nccl_v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE "[^0-9;]|#define NCCL_[A-Z]+ " "" _sp_nccl_v "${_sp_nccl_v}")
    string(REPLACE ";" "." _sp_nccl_v "${_sp_nccl_v}")
    add_library(NCCL::nccl UNKNOWN IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                          INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
    add_compile_definitions(STARPIPE_HAVE_NCCL=1)
  endif()
  message(STATUS "starpipe CUDA: StarPU ${_sp_prefix}, CUDA ${CUDAToolkit_VERSION} "
    "(${CUDAToolkit_LIBRARY_DIR}), arch ${CMAKE_CUDA_ARCHITECTURES}, "
    "NCCL ${_sp_nccl_v} ${NCCL_LIBRARY}")

  # --- the CUDA kernels (codelets/cuda/*.cu) and their table (backend.c) ---
  file(GLOB STARPIPE_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/codelets/cuda/*.cu)
  add_library(starpipe_cuda_kernels STATIC ${STARPIPE_CUDA_SOURCES}
              ${CMAKE_SOURCE_DIR}/codelets/cuda/backend.c)
  target_include_directories(starpipe_cuda_kernels PUBLIC ${CMAKE_SOURCE_DIR}/include
                             ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/codelets/cuda)
  target_link_libraries(starpipe_cuda_kernels PUBLIC CUDA::cudart CUDA::cublas)
endif()

# Called by comm/ and runtime/ on their targets: the CUDA kernels and their table, cuBLAS,
# NCCL, and a check that pkg-config really gave the CUDA StarPU.
function(starpipe_cuda_link target)
  foreach(_m STARPU STARPUMPI)
    list(GET ${_m}_LINK_LIBRARIES 0 _lib)
    get_filename_component(_dir "${_lib}" DIRECTORY)
    get_filename_component(_dir "${_dir}" ABSOLUTE)
    if(NOT _dir STREQUAL STARPIPE_STARPU_LIBDIR)
      message(FATAL_ERROR "STARPIPE_CUDA: pkg-config gave ${_lib}, not the CUDA StarPU in "
        "${STARPIPE_STARPU_LIBDIR}; configure a fresh build folder")
    endif()
  endforeach()
  target_link_libraries(${target} PUBLIC starpipe_cuda_kernels CUDA::cudart CUDA::cublas)
  if(TARGET NCCL::nccl)
    target_link_libraries(${target} PUBLIC NCCL::nccl)
  endif()
endfunction()

# Called at the end of the top-level CMakeLists.txt: tests/gpu, the checks that need a
# GPU (run by tests/gpu/check.sh; in ctest with label gpu, exit 77 = skipped).
function(starpipe_cuda_tests)
  set(_d ${CMAKE_SOURCE_DIR}/tests/gpu)
  if(TARGET test_cuda_kernels)   # tests/CMakeLists.txt already took tests/gpu in
    return()
  endif()
  if(EXISTS ${_d}/CMakeLists.txt)
    add_subdirectory(${_d} ${CMAKE_BINARY_DIR}/tests/gpu)
    return()
  endif()
  file(GLOB _src ${_d}/test_cuda_kernels.c ${_d}/test_cuda_kernels.cu)
  if(NOT _src)
    return()
  endif()
  add_executable(test_cuda_kernels ${_src})
  target_link_libraries(test_cuda_kernels PRIVATE starpipe_cuda_kernels starpipe_kernels)
  set_target_properties(test_cuda_kernels PROPERTIES
                        RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/gpu)
  add_test(NAME gpu_cuda_kernels COMMAND test_cuda_kernels)
  set_tests_properties(gpu_cuda_kernels PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 120)
endfunction()
