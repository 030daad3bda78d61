# sp_cu2cpp(OUT_VAR DIR): build rules that rewrite every codelets/cuda/*.cu into C++ for
# the CPU emulation (cu2cpp.cmake) under DIR; OUT_VAR gets the .cpp files. Used by the
# emulation of every build (tests/gpu/emu) and by the fake device's kernels
# (tests/gpu/fake/FakeGpu.cmake).
set(_sp_cu2cpp_script ${CMAKE_CURRENT_LIST_DIR}/cu2cpp.cmake)
function(sp_cu2cpp out_var dir)
  file(GLOB _cu CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/codelets/cuda/*.cu)
  set(_cpp "")
  foreach(_f ${_cu})
    get_filename_component(_name ${_f} NAME_WE)
    set(_out ${dir}/${_name}.cpp)
    add_custom_command(OUTPUT ${_out}
      COMMAND ${CMAKE_COMMAND} -DIN=${_f} -DOUT=${_out} -P ${_sp_cu2cpp_script}
      DEPENDS ${_f} ${_sp_cu2cpp_script}
      COMMENT "Rewriting codelets/cuda/${_name}.cu for the CPU emulation" VERBATIM)
    list(APPEND _cpp ${_out})
  endforeach()
  set(${out_var} ${_cpp} PARENT_SCOPE)
endfunction()
