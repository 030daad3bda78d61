# The fuzz targets and what each links; shared by fuzz/CMakeLists.txt (libFuzzer builds)
# and tests/fuzz/CMakeLists.txt (corpus replay in the ordinary build).
# sp_fuzz_targets(<prefix> <extra source>) defines <prefix><target> for every target.
set(SP_FUZZ_TARGETS schedule_text schedule_env app_args safetensors)
set(SP_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})
function(sp_fuzz_targets prefix extra)
  foreach(t ${SP_FUZZ_TARGETS})
    set(exe ${prefix}${t})
    add_executable(${exe} ${SP_FUZZ_DIR}/fuzz_${t}.c ${extra})
    target_include_directories(${exe} PRIVATE ${SP_FUZZ_DIR}/..)
    if(t STREQUAL "app_args")
      # the apps' parser, with the two apps' flag handlers compiled into the target
      target_sources(${exe} PRIVATE ${SP_FUZZ_DIR}/../apps/options.c ${SP_FUZZ_DIR}/../apps/outputs.c
                                    ${SP_FUZZ_DIR}/../apps/checkpoint.c
                                    ${SP_FUZZ_DIR}/stub_runtime.c)
      target_link_libraries(${exe} PRIVATE starpipe_graph starpipe_sched starpipe_formats)
    elseif(t STREQUAL "safetensors")
      target_link_libraries(${exe} PRIVATE starpipe_formats)
    else()
      target_link_libraries(${exe} PRIVATE starpipe_sched)
    endif()
  endforeach()
endfunction()
