# Install the build tree into a scratch prefix, then configure, build and run a consumer that
# uses find_package(gvq), and check gvq.pc. Arguments: -DBUILD=<gvq build dir> -DWORK=<scratch dir>
# -DCONSUMER=<consumer source dir>.
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
foreach(f include/gvq.h include/gvq_mpi.h lib/cmake/gvq/gvqConfig.cmake lib/pkgconfig/gvq.pc)
  if(NOT EXISTS ${WORK}/prefix/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/consumer
                        -DCMAKE_PREFIX_PATH=${WORK}/prefix RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "find_package(gvq) consumer did not configure")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer did not build")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${WORK}/prefix/lib ${WORK}/consumer/app
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer failed to run")
endif()
file(READ ${WORK}/prefix/lib/pkgconfig/gvq.pc pc)
if(NOT pc MATCHES "Libs: -L\\\${libdir} -lgvq")
  message(FATAL_ERROR "gvq.pc lacks the Libs line")
endif()
