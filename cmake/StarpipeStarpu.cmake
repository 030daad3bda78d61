# Which StarPU the runtime (runtime/, comm/, sched/policy.c) is built against. Included by
# the top-level CMakeLists.txt after cmake/StarpipeCuda.cmake, with STARPIPE_WITH_STARPU ON.
#
#   (nothing)                          the system's StarPU 1.3 (Debian libstarpu-dev), pkg-config
#   -DSTARPIPE_STARPU_PREFIX=DIR       the StarPU installed in DIR: scripts/build-starpu-cuda
#                                      (1.3 with CUDA) or scripts/build-starpu-1.4 (1.4.7, CPU);
#                                      its version read from DIR/include/starpu/<version>/
#   -DSTARPIPE_STARPU_VERSION=1.4      build/starpu-1.4 (scripts/build-starpu-1.4) when it is
#                                      there, else pkg-config's starpu-1.4 (a cluster's module)
#
# A StarPU from a prefix is linked with an RPATH (not RUNPATH) to DIR/lib: the system's
# StarPU must not be loaded in its place.
# Gives PkgConfig::STARPU, PkgConfig::STARPUMPI, STARPIPE_STARPU_VERSION (the version
# found: 1.3 or 1.4) and, with a prefix, STARPIPE_STARPU_LIBDIR.

set(STARPIPE_STARPU_VERSION "" CACHE STRING
    "StarPU major.minor to build against, 1.3 or 1.4 (empty: the prefix's, else 1.3)")
set(_sp_want "${STARPIPE_STARPU_VERSION}")
if(_sp_want AND NOT _sp_want MATCHES "^1\\.[34]$")
  message(FATAL_ERROR "STARPIPE_STARPU_VERSION=${_sp_want}: starpipe builds with StarPU 1.3 or 1.4")
endif()

set(_sp_prefix "${STARPIPE_STARPU_PREFIX}")
if(NOT _sp_prefix AND _sp_want STREQUAL "1.4"
   AND EXISTS ${CMAKE_SOURCE_DIR}/build/starpu-1.4/lib/pkgconfig/starpu-1.4.pc)
  set(_sp_prefix ${CMAKE_SOURCE_DIR}/build/starpu-1.4)
endif()

# pkg_check_modules caches its answer: look StarPU up again on every configure
unset(__pkg_config_checked_STARPU CACHE)
unset(__pkg_config_checked_STARPUMPI CACHE)
if(_sp_prefix)
  get_filename_component(_sp_prefix "${_sp_prefix}" ABSOLUTE)
  # the version is the folder of its headers (a 1.4 install also has starpu-1.3.pc files,
  # aliases of its starpu-1.4.pc)
  set(_sp_found "")
  foreach(_v 1.4 1.3)
    if(EXISTS ${_sp_prefix}/include/starpu/${_v}/starpu_config.h
       AND EXISTS ${_sp_prefix}/lib/pkgconfig/starpu-${_v}.pc)
      set(_sp_found ${_v})
      break()
    endif()
  endforeach()
  if(NOT _sp_found)
    message(FATAL_ERROR "no StarPU 1.3 or 1.4 in '${_sp_prefix}' (include/starpu/<version>/, "
      "lib/pkgconfig/starpu-<version>.pc): build one with scripts/build-starpu-1.4 [PREFIX] "
      "or scripts/build-starpu-cuda [PREFIX]")
  endif()
  if(_sp_want AND NOT _sp_want STREQUAL _sp_found)
    message(FATAL_ERROR "STARPIPE_STARPU_VERSION=${_sp_want}, but ${_sp_prefix} holds StarPU "
      "${_sp_found}")
  endif()
  set(_sp_want ${_sp_found})
  if(NOT STARPIPE_STARPU_LIBDIR) # StarpipeCuda.cmake has already put the CUDA one first
    set(STARPIPE_STARPU_LIBDIR ${_sp_prefix}/lib)
    set(ENV{PKG_CONFIG_PATH} "${_sp_prefix}/lib/pkgconfig:$ENV{PKG_CONFIG_PATH}")
    list(APPEND CMAKE_BUILD_RPATH ${STARPIPE_STARPU_LIBDIR})
    list(APPEND CMAKE_INSTALL_RPATH ${STARPIPE_STARPU_LIBDIR})
    add_link_options(LINKER:--disable-new-dtags)
  endif()
elseif(NOT _sp_want)
  set(_sp_want 1.3)
endif()
set(STARPIPE_STARPU_VERSION ${_sp_want})   # the version found, for the code below

pkg_check_modules(STARPU IMPORTED_TARGET starpu-${_sp_want})
pkg_check_modules(STARPUMPI IMPORTED_TARGET starpumpi-${_sp_want})
pkg_check_modules(HWLOC IMPORTED_TARGET hwloc)
find_package(MPI COMPONENTS C)
if(NOT STARPU_FOUND OR NOT STARPUMPI_FOUND OR NOT MPI_C_FOUND OR NOT HWLOC_FOUND)
  if(_sp_want STREQUAL "1.3")
    message(FATAL_ERROR "StarPU 1.3 with StarPU-MPI and an MPI are needed "
      "(Debian: libstarpu-dev libstarpumpi-1.3-3 libopenmpi-dev openmpi-bin libhwloc-dev): "
      "run scripts/install-deps, or configure with -DSTARPIPE_WITH_STARPU=OFF")
  else()
    message(FATAL_ERROR "StarPU ${_sp_want} with StarPU-MPI (pkg-config starpu-${_sp_want}, "
      "starpumpi-${_sp_want}), hwloc and an MPI are needed: build it with "
      "scripts/build-starpu-1.4 and pass -DSTARPIPE_STARPU_PREFIX=build/starpu-1.4")
  endif()
endif()
if(_sp_prefix)
  # pkg-config must have given the prefix's StarPU, not one on the user's own path
  foreach(_m STARPU STARPUMPI)
    list(GET ${_m}_LINK_LIBRARIES 0 _lib)
    get_filename_component(_dir "${_lib}" DIRECTORY)
    get_filename_component(_dir "${_dir}" ABSOLUTE)
    if(NOT _dir STREQUAL STARPIPE_STARPU_LIBDIR)
      message(FATAL_ERROR "pkg-config gave ${_lib}, not the StarPU in ${STARPIPE_STARPU_LIBDIR}")
    endif()
  endforeach()
endif()
message(STATUS "starpipe: StarPU ${STARPU_VERSION} (${STARPU_LINK_LIBRARIES})")
