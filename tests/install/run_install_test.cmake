# Installs gvq, then builds and runs two consumers against the installed copy: one through
# find_package(gvq), one with plain gcc and pkg-config. Arguments (-D):
#   MODE       build-tree: `cmake --install BUILD --prefix WORK/prefix` (the libdir as BUILD was
#              configured); multiarch: configure SRC as Debian packages it (prefix /usr, libdir
#              lib/ARCH), build the library, install with DESTDIR=WORK/root
#   BUILD      the gvq build dir (build-tree)      SRC       the gvq sources (multiarch)
#   WORK       scratch dir (emptied first; default: a temporary one)   CONSUMER  consumer sources
#   CC         C compiler for the pkg-config consumer          MPIEXEC  to run the consumers
#   WITH_CUDA  whether BUILD has CUDA (gvq.pc must then name the CUDA libraries; build-tree)
#   ARCH       multiarch triplet (CMAKE_LIBRARY_ARCHITECTURE; x86_64-linux-gnu when empty)
cmake_minimum_required(VERSION 3.25)
# WORK unset: a fresh folder under $TMPDIR (or /tmp), removed when everything passed and kept
# for a look when something failed (outside the build tree, so scripts/check-calls.py never
# sees the second build's objects)
set(remove_work OFF)
if(NOT WORK)
  set(tmp /tmp)
  if(DEFINED ENV{TMPDIR} AND IS_DIRECTORY "$ENV{TMPDIR}")
    set(tmp $ENV{TMPDIR})
  endif()
  string(RANDOM LENGTH 10 ALPHABET 0123456789abcdef rnd)
  set(WORK ${tmp}/gvq-install-${MODE}-${rnd})
  set(remove_work ON)
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n(scratch folder kept: ${WORK})")
  endif()
  message(STATUS "${what}: ok")
endfunction()

# ---- install ------------------------------------------------------------------------------------
if(MODE STREQUAL "build-tree")
  set(prefix ${WORK}/prefix)
  run("cmake --install --prefix ${prefix}" ${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})
  file(GLOB pcs ${prefix}/lib*/pkgconfig/gvq.pc ${prefix}/lib/*/pkgconfig/gvq.pc)
elseif(MODE STREQUAL "multiarch")
  if(NOT ARCH)
    set(ARCH x86_64-linux-gnu)
  endif()
  set(libdir_rel lib/${ARCH})
  set(prefix ${WORK}/root/usr)
  # the library alone, unoptimised (fast): only the install layout is under test here
  run("configure with prefix /usr, libdir ${libdir_rel}" ${CMAKE_COMMAND} -S ${SRC}
      -B ${WORK}/build -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_INSTALL_LIBDIR=${libdir_rel}
      -DCMAKE_BUILD_TYPE=None -DGVQ_WITH_CUDA=OFF -DGVQ_BUILD_TESTS=OFF -DGVQ_BUILD_PERF=OFF)
  cmake_host_system_information(RESULT ncpu QUERY NUMBER_OF_LOGICAL_CORES)
  run("build the library" ${CMAKE_COMMAND} --build ${WORK}/build -j ${ncpu})
  run("DESTDIR=${WORK}/root cmake --install" ${CMAKE_COMMAND} -E env DESTDIR=${WORK}/root
      ${CMAKE_COMMAND} --install ${WORK}/build)
  set(pcs ${prefix}/${libdir_rel}/pkgconfig/gvq.pc)
  set(WITH_CUDA OFF) # this second build is the library without CUDA, whatever BUILD has
else()
  message(FATAL_ERROR "MODE must be build-tree or multiarch, not '${MODE}'")
endif()

list(LENGTH pcs npcs)
if(NOT npcs EQUAL 1 OR NOT EXISTS "${pcs}")
  message(FATAL_ERROR "gvq.pc not installed where expected (found: '${pcs}')")
endif()
get_filename_component(pcdir ${pcs} DIRECTORY)
get_filename_component(libdir ${pcdir} DIRECTORY)
foreach(f ${prefix}/include/gvq.h ${prefix}/include/gvq_mpi.h ${prefix}/include/gvq_train.h ${libdir}/cmake/gvq/gvqConfig.cmake
          ${libdir}/libgvq.so)
  if(NOT EXISTS ${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
message(STATUS "installed under ${prefix}, libdir ${libdir}")

# ---- gvq.pc: its folders resolve to the installed ones ------------------------------------------
find_program(PKG_CONFIG NAMES pkg-config pkgconf REQUIRED)
set(pcenv ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${pcdir})
function(pc_query out)
  execute_process(COMMAND ${pcenv} ${PKG_CONFIG} ${ARGN} gvq RESULT_VARIABLE rc
                  OUTPUT_VARIABLE v ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc)
    message(FATAL_ERROR "pkg-config ${ARGN} gvq failed: ${err}")
  endif()
  set(${out} "${v}" PARENT_SCOPE)
endfunction()
pc_query(pcfile --path)
file(REAL_PATH "${pcfile}" pcfile)
file(REAL_PATH "${pcs}" pcs_real)
if(NOT pcfile STREQUAL pcs_real)
  message(FATAL_ERROR "pkg-config found ${pcfile}, not the installed ${pcs_real}")
endif()
foreach(var_dir "includedir;${prefix}/include" "libdir;${libdir}" "prefix;${prefix}")
  list(GET var_dir 0 var)
  list(GET var_dir 1 want)
  pc_query(got --variable=${var})
  if(NOT IS_DIRECTORY "${got}")
    message(FATAL_ERROR "gvq.pc: ${var} = '${got}' is not a folder (want ${want})")
  endif()
  file(REAL_PATH "${got}" got_real)
  file(REAL_PATH "${want}" want_real)
  if(NOT got_real STREQUAL want_real)
    message(FATAL_ERROR "gvq.pc: ${var} = '${got}' resolves to ${got_real}, want ${want_real}")
  endif()
endforeach()
if(WITH_CUDA)
  pc_query(static_libs --static --libs)
  foreach(l -lcudart -lcublas -lcusolver)
    if(NOT static_libs MATCHES "${l}")
      message(FATAL_ERROR "gvq.pc of a CUDA build lacks ${l}: ${static_libs}")
    endif()
  endforeach()
endif()

# ---- consumers ----------------------------------------------------------------------------------
set(ldenv ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir})
set(mpirun ${MPIEXEC} -n 2 --oversubscribe)

# 1. find_package(gvq)
run("find_package(gvq) consumer: configure" ${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/consumer
    -DCMAKE_PREFIX_PATH=${prefix} -DGVQ_EXPECT_PREFIX=${prefix})
run("find_package(gvq) consumer: build" ${CMAKE_COMMAND} --build ${WORK}/consumer)
run("find_package(gvq) consumer: run at 2 ranks" ${ldenv} ${mpirun} ${WORK}/consumer/app)

# 2. gcc app.c $(pkg-config --cflags --libs gvq)
pc_query(cflags_text --cflags)
pc_query(libs_text --libs)
separate_arguments(cflags UNIX_COMMAND "${cflags_text}")
separate_arguments(libs UNIX_COMMAND "${libs_text}")
run("gcc + pkg-config consumer: build (${CC} app.c ${cflags_text} -o app_pc ${libs_text})" ${CC}
    ${CONSUMER}/app.c ${cflags} -o ${WORK}/app_pc ${libs})
run("gcc + pkg-config consumer: run at 2 ranks" ${ldenv} ${mpirun} ${WORK}/app_pc)
# 3. docs/PORTING.md's compile lines as written (its first ```sh block, PREFIX replaced by the
#    prefix, trainer.c by consumer/zero_code_app.c), then the program started without
#    LD_LIBRARY_PATH: the documented -rpath must let it find libgvq.so.0; GVQ_CODEC=auto with a
#    layout built by gvqLayoutAppend (docs/ZERO_CODE.md). Only where the libdir is PREFIX/lib,
#    the folder the documented PKG_CONFIG_PATH names.
if(EXISTS ${SRC}/docs/PORTING.md AND pcdir STREQUAL "${prefix}/lib/pkgconfig")
  file(READ ${SRC}/docs/PORTING.md porting)
  string(FIND "${porting}" "```sh\n" at)
  string(SUBSTRING "${porting}" ${at} -1 porting)
  string(SUBSTRING "${porting}" 6 -1 porting)
  string(FIND "${porting}" "```" end)
  string(SUBSTRING "${porting}" 0 ${end} doc_cmds)
  string(REPLACE "PREFIX" "${prefix}" doc_cmds "${doc_cmds}")
  string(REPLACE "trainer.c" "${CONSUMER}/zero_code_app.c" doc_cmds "${doc_cmds}")
  string(REPLACE "-o trainer" "-o ${WORK}/trainer" doc_cmds "${doc_cmds}")
  file(WRITE ${WORK}/porting_build.sh "set -e\n${doc_cmds}")
  run("PORTING.md's compile lines as written:\n${doc_cmds}" bash ${WORK}/porting_build.sh)
  run("PORTING.md's program started without LD_LIBRARY_PATH, GVQ_CODEC=auto" ${CMAKE_COMMAND} -E env
      --unset=LD_LIBRARY_PATH GVQ_CODEC=auto ${mpirun} ${WORK}/trainer)
endif()
if(remove_work)
  file(REMOVE_RECURSE ${WORK})
endif()
