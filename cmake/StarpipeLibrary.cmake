# The installed library: one shared libstarpipe (graph, kernels, planner, formats, and with StarPU
# the runtime, comm and codelets) made of the objects of the internal static libraries,
# which the tests keep linking (they reach private headers and symbols). Compiled once:
# the static libraries are built position-independent so both can share the objects.
# Included by the top-level CMakeLists.txt after runtime/; installs, with `cmake --install`:
#   lib/libstarpipe.so.0.1.0 (soname libstarpipe.so.0), include/starpipe/*.h,
#   lib/cmake/starpipe/ (find_package(starpipe) -> starpipe::starpipe), lib/pkgconfig/starpipe.pc
# and the apps into bin/.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
include(CheckCCompilerFlag)

set(_sp_parts starpipe_base starpipe_kernels starpipe_formats starpipe_sched starpipe_graph
              starpipe_tasks)
if(TARGET starpipe_runtime)
  list(APPEND _sp_parts starpipe_devices starpipe_comm starpipe_policy starpipe_runtime)
endif()
if(TARGET starpipe_cuda_kernels)
  get_target_property(_sp_type starpipe_cuda_kernels TYPE)
  if(_sp_type STREQUAL "STATIC_LIBRARY")
    list(APPEND _sp_parts starpipe_cuda_kernels)
  endif()
endif()
# -fno-semantic-interposition: PIC code that still inlines and calls directly within a
# file, as the non-PIC code did (the same objects go into the tests and the benchmarks).
check_c_compiler_flag(-fno-semantic-interposition _sp_has_fnsi)
set(_sp_objects "")
foreach(_t ${_sp_parts})
  set_target_properties(${_t} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(_sp_has_fnsi)
    target_compile_options(${_t} PRIVATE $<$<COMPILE_LANGUAGE:C>:-fno-semantic-interposition>)
  endif()
  list(APPEND _sp_objects $<TARGET_OBJECTS:${_t}>)
endforeach()

add_library(starpipe SHARED ${_sp_objects})
add_library(starpipe::starpipe ALIAS starpipe)
set_target_properties(starpipe PROPERTIES VERSION ${PROJECT_VERSION}
                      SOVERSION ${PROJECT_VERSION_MAJOR} LINKER_LANGUAGE C EXPORT_NAME starpipe)
# Only the public headers: a user of the library, in-tree apps included, sees nothing else.
target_include_directories(starpipe INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

# Dependencies. In the build tree they are this project's pkg-config targets; installed,
# starpipeConfig.cmake looks them up again under names of its own (PkgConfig::starpipe_*),
# so a user's own StarPU or OpenBLAS lookups do not collide with ours.
function(_sp_dep scope build install)
  target_link_libraries(starpipe ${scope} $<BUILD_INTERFACE:${build}>
                                          $<INSTALL_INTERFACE:${install}>)
endfunction()
_sp_dep(PUBLIC PkgConfig::OPENBLAS PkgConfig::starpipe_openblas)
_sp_dep(PUBLIC ${MATH_LIB} m)
# formats/: used inside the library only (no public header names them), so a program
# linking libstarpipe needs neither; the library records them (DT_NEEDED)
target_link_libraries(starpipe PRIVATE PkgConfig::JANSSON PkgConfig::ZLIB)
if(TARGET starpipe_runtime)
  _sp_dep(PUBLIC PkgConfig::STARPU PkgConfig::starpipe_starpu)
  _sp_dep(PUBLIC PkgConfig::STARPUMPI PkgConfig::starpipe_starpumpi)
  target_link_libraries(starpipe PUBLIC MPI::MPI_C PRIVATE PkgConfig::HWLOC)
endif()
if(STARPIPE_CUDA AND STARPIPE_FAKE_GPU)
  # the fake device's libraries (tests/gpu/fake) serve this build tree only
  target_link_libraries(starpipe PUBLIC $<BUILD_INTERFACE:CUDA::cudart> $<BUILD_INTERFACE:CUDA::cublas>)
  if(TARGET NCCL::nccl)
    target_link_libraries(starpipe PUBLIC $<BUILD_INTERFACE:NCCL::nccl>)
  endif()
elseif(STARPIPE_CUDA)
  target_link_libraries(starpipe PUBLIC CUDA::cudart CUDA::cublas)
  # installed, the library loads the cudart, cuBLAS and NCCL it was built with (a
  # machine may have other copies on its loader path)
  set_property(TARGET starpipe APPEND PROPERTY INSTALL_RPATH ${CUDAToolkit_LIBRARY_DIR})
  if(TARGET NCCL::nccl)
    target_link_libraries(starpipe PUBLIC NCCL::nccl)
    get_filename_component(_sp_nccl_dir ${NCCL_LIBRARY} DIRECTORY)
    if(NOT _sp_nccl_dir STREQUAL CUDAToolkit_LIBRARY_DIR)
      set_property(TARGET starpipe APPEND PROPERTY INSTALL_RPATH ${_sp_nccl_dir})
    endif()
  endif()
  # libstarpu of the CPU-only system StarPU has the same soname as the CUDA one: every
  # program linking the installed library gets an RPATH to the CUDA StarPU, as ours do.
  target_link_options(starpipe INTERFACE
    $<INSTALL_INTERFACE:LINKER:--disable-new-dtags>
    $<INSTALL_INTERFACE:LINKER:-rpath,${STARPIPE_STARPU_LIBDIR}>)
elseif(STARPIPE_STARPU_LIBDIR AND TARGET starpipe_runtime)
  # a CPU StarPU from a prefix (scripts/build-starpu-1.4): not on the loader's path either
  target_link_options(starpipe INTERFACE
    $<INSTALL_INTERFACE:LINKER:--disable-new-dtags>
    $<INSTALL_INTERFACE:LINKER:-rpath,${STARPIPE_STARPU_LIBDIR}>)
endif()

# --- install: library, headers, CMake package, pkg-config file ---
# (The library's install RPATH: in the CUDA build, its StarPU and CUDA libraries.)
install(TARGETS starpipe EXPORT starpipeTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/starpipe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
set(_sp_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/starpipe)
install(EXPORT starpipeTargets NAMESPACE starpipe:: DESTINATION ${_sp_cmakedir})

# What starpipeConfig.cmake.in and starpipe.pc.in fill in.
set(STARPIPE_HAVE_RUNTIME OFF)
if(TARGET starpipe_runtime)
  set(STARPIPE_HAVE_RUNTIME ON)
endif()
set(STARPIPE_CONFIG_CUDA OFF)
set(STARPIPE_CONFIG_CUDA_ROOT "")
set(STARPIPE_CONFIG_NCCL_LIBRARY "")
set(STARPIPE_CONFIG_NCCL_INCLUDE_DIR "")
if(STARPIPE_CUDA)
  set(STARPIPE_CONFIG_CUDA ON)
  get_filename_component(STARPIPE_CONFIG_CUDA_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  if(TARGET NCCL::nccl)
    set(STARPIPE_CONFIG_NCCL_LIBRARY ${NCCL_LIBRARY})
    set(STARPIPE_CONFIG_NCCL_INCLUDE_DIR ${NCCL_INCLUDE_DIR})
  endif()
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/starpipeConfig.cmake.in
  ${PROJECT_BINARY_DIR}/starpipeConfig.cmake INSTALL_DESTINATION ${_sp_cmakedir})
# soname 0: every 0.x release keeps the ABI of 0.1
write_basic_package_version_file(${PROJECT_BINARY_DIR}/starpipeConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/starpipeConfig.cmake
              ${PROJECT_BINARY_DIR}/starpipeConfigVersion.cmake DESTINATION ${_sp_cmakedir})

# pkg-config: shared-library users need only -lstarpipe (the library records its own
# dependencies); the rest is for --static and for the header search paths of the deps.
set(STARPIPE_PC_REQUIRES_PRIVATE "openblas jansson zlib")
set(STARPIPE_PC_LIBS_PRIVATE "-lm")
if(STARPIPE_HAVE_RUNTIME)
  set(_sp_v ${STARPIPE_STARPU_VERSION})
  if(STARPIPE_STARPU_LIBDIR)
    # a StarPU from a prefix (CUDA, or 1.4) is not on the user's pkg-config path: name its
    # files directly
    set(_sp_dir ${STARPIPE_STARPU_LIBDIR})
    string(PREPEND STARPIPE_PC_LIBS_PRIVATE
           "-L${_sp_dir} -Wl,-rpath,${_sp_dir} -lstarpumpi-${_sp_v} -lstarpu-${_sp_v} ")
    string(APPEND STARPIPE_PC_REQUIRES_PRIVATE " hwloc")
  else()
    string(APPEND STARPIPE_PC_REQUIRES_PRIVATE " starpumpi-${_sp_v} starpu-${_sp_v} hwloc")
  endif()
  string(APPEND STARPIPE_PC_REQUIRES_PRIVATE " mpi-c")
endif()
if(STARPIPE_CUDA)
  string(APPEND STARPIPE_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcublas -lcudart")
  if(TARGET NCCL::nccl)
    string(APPEND STARPIPE_PC_LIBS_PRIVATE " -L${_sp_nccl_dir} -lnccl")
  endif()
endif()
# libdir and includedir relative to the .pc file, so `cmake --install --prefix` anywhere works
file(RELATIVE_PATH STARPIPE_PC_PREFIX_FROM_PCDIR
     /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" STARPIPE_PC_PREFIX_FROM_PCDIR "${STARPIPE_PC_PREFIX_FROM_PCDIR}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/starpipe.pc.in ${PROJECT_BINARY_DIR}/starpipe.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/starpipe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The apps, installed into bin/ by apps/CMakeLists.txt, find the library in ../lib.
list(APPEND CMAKE_INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
